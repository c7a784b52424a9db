"""The files door: `POST /api/files` uploads one file (multipart field `file`), `GET /api/files/<id>`
reads one back (its owner and staff only). The page's session cookie (with its CSRF token) or an API
key (`Authorization: Bearer`) says who calls. Thin: `content` says what a file is, `sessions_app.files`
keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.utils.http import content_disposition_header
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt

from chat.files.content import TEXT_TYPES, FileRefused, inspect
from chat.httpapi.auth import bearer
from sessions_app import files, tokens
from sessions_app.models import KeyScope, StoredFile

FIELD = "file"
# room for a multipart body's boundaries and headers around the file itself
MULTIPART_OVERHEAD = 64 * 1024


@dataclass(frozen=True)
class FileCaller:
    user_id: int
    is_staff: bool


def _error(status: int, message: str, code: str, **extra: Any) -> JsonResponse:
    return JsonResponse({"error": {"message": message, "code": code, **extra}}, status=status)


def _caller(request: HttpRequest, scope: KeyScope) -> FileCaller | JsonResponse:
    """Who calls: the API key's holder (with `scope`), or the signed-in user (a POST with its CSRF token)."""
    header = request.headers.get("Authorization")
    if header:
        holder = tokens.find_key(bearer(header))
        if holder is None:
            response = _error(401, "missing or invalid API key: send `Authorization: Bearer <key>`", "invalid_api_key")
            response["WWW-Authenticate"] = "Bearer"
            return response
        if scope.value not in holder.scopes and KeyScope.ADMIN.value not in holder.scopes:
            return _error(403, f"this API key lacks the `{scope.value}` scope", "insufficient_scope")
        tokens.note_use(holder.token_id)
        return FileCaller(holder.user_id, holder.is_staff)
    user = request.user
    if not user.is_authenticated:
        return _error(401, "sign in, or send an API key as `Authorization: Bearer <key>`", "not_authenticated")
    if request.method == "POST":
        refused = CsrfViewMiddleware(lambda r: HttpResponse()).process_view(request, None, (), {})  # type: ignore[arg-type]
        if refused is not None:
            return _error(403, "the CSRF token is missing or wrong", "csrf_failed")
    return FileCaller(user.pk, bool(user.is_staff))


def described(stored: StoredFile) -> dict[str, Any]:
    """A stored file as the API answers it."""
    return {
        "id": stored.file_id,
        "mimeType": stored.mime_type,
        "fileName": stored.name,
        "size": stored.size,
        "sha256": stored.sha256,
    }


@csrf_exempt  # an API key needs none; the cookie's CSRF token is checked in `_caller`
@never_cache
def upload(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return _error(405, "POST a multipart form with the file in its `file` field", "method_not_allowed")
    caller = _caller(request, KeyScope.WRITE)
    if isinstance(caller, HttpResponse):
        return caller
    limit = max(settings.GATEWAY_MAX_ATTACHMENT_BYTES, settings.GATEWAY_MAX_IMAGE_BYTES)
    try:
        declared_length = int(request.headers.get("Content-Length") or 0)
    except ValueError:
        declared_length = 0
    if declared_length > limit + MULTIPART_OVERHEAD:
        return _error(413, f"a file is at most {limit} bytes", "too-large", maxBytes=limit)
    if not (request.content_type or "").startswith("multipart/form-data"):
        return _error(400, "send a multipart/form-data body with the file in its `file` field", "bad-request")
    upload = request.FILES.get(FIELD)
    if upload is None:
        return _error(400, "the multipart body has no `file` field", "bad-request", field=FIELD)
    if upload.size is not None and upload.size > limit:
        return _error(413, f"a file is at most {limit} bytes (this one is {upload.size})", "too-large", maxBytes=limit)
    data = upload.read()
    name = (upload.name or "").replace("\x00", "")[:255]
    if not data:
        return _error(400, "the file is empty", "empty", field=FIELD)
    try:
        found = inspect(data, name=name, declared=upload.content_type)
    except FileRefused as exc:
        return _error(exc.status, exc.message, exc.reason, field=FIELD)
    stored = files.store(
        owner_id=caller.user_id,
        data=data,
        mime_type=found.mime_type,
        name=name,
        sha256=found.sha256,
        text=found.text,
    )
    return JsonResponse(described(stored), status=201)


@never_cache
def read(request: HttpRequest, file_id: str) -> HttpResponse:
    """A file's bytes, to its owner and to staff; anyone else is told it is not there."""
    if request.method not in ("GET", "HEAD"):
        return _error(405, "GET a file", "method_not_allowed")
    caller = _caller(request, KeyScope.READ)
    if isinstance(caller, HttpResponse):
        return caller
    stored = files.find(file_id)
    if stored is None or (stored.owner_id != caller.user_id and not caller.is_staff):
        return _error(404, "no such file", "not_found")
    try:
        data = files.read_bytes(stored)
    except OSError:
        return _error(410, "the file's bytes are gone", "gone")
    mime = stored.mime_type
    content_type = f"{mime}; charset=utf-8" if mime in TEXT_TYPES else mime
    response = HttpResponse(data, content_type=content_type)
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "sandbox; default-src 'none'"
    disposition = content_disposition_header(not mime.startswith("image/"), stored.name or stored.file_id)
    if disposition:
        response["Content-Disposition"] = disposition
    return response
