"""The API keys page (/api/keys): a signed-in user makes and revokes their own keys (HTTP-API.md §14.1).

Thin: `sessions_app.tokens` makes, lists and revokes keys and holds their rules; this page reads the
form and shows the answer. A new key's raw value is in the one response that made it and nowhere
else (not stored, not in a redirect or a message), so it is shown once.
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from sessions_app import tokens
from sessions_app.models import ApiToken, KeyScope, default_key_scopes


@dataclass(frozen=True)
class ScopeChoice:
    """One scope as the form offers it."""

    value: str
    label: str
    what: str
    checked: bool


SCOPE_TEXT = {
    KeyScope.READ: ("read", "list sessions and models, read history (every key has it)"),
    KeyScope.WRITE: ("write", "send messages, run, abort, change sessions"),
    KeyScope.APPROVALS: ("approvals", "see and answer your tool approvals"),
    KeyScope.ADMIN: ("admin", "other users' sessions (staff only)"),
}


def scope_choices(staff: bool, chosen: list[str] | None) -> list[ScopeChoice]:
    """The form's scopes: `admin` only for staff; checked as last sent, else the default scopes."""
    checked = set(default_key_scopes() if chosen is None else chosen)
    return [
        ScopeChoice(scope.value, *SCOPE_TEXT[scope], scope.value in checked)
        for scope in KeyScope
        if staff or scope != KeyScope.ADMIN
    ]


def _page(
    request: HttpRequest,
    *,
    created: ApiToken | None = None,
    raw_key: str = "",
    error: tokens.KeyRefused | None = None,
    status: int = HTTPStatus.OK,
) -> HttpResponse:
    user: Any = request.user
    keys = tokens.keys_of(user.pk)
    active = sum(1 for key in keys if key.revoked_at is None)
    sent = error is not None
    context = {
        "keys": keys,
        "active": active,
        "limit": tokens.max_active_keys(),
        "name_max": tokens.NAME_MAX,
        "scopes": scope_choices(user.is_staff, request.POST.getlist("scopes") if sent else None),
        "name": request.POST.get("name", "") if sent else "",
        "error": error,
        "created": created,
        "raw_key": raw_key,
    }
    return render(request, "chat/keys.html", context, status=status)


@never_cache
@login_required
@require_http_methods(["GET", "POST"])
def index(request: HttpRequest) -> HttpResponse:
    """GET: the list and the form. POST: make a key and show it, this once."""
    if request.method != "POST":
        return _page(request)
    name = request.POST.get("name", "").strip()
    if not name:
        return _page(request, error=tokens.KeyRefused("give the key a name", "name"), status=HTTPStatus.BAD_REQUEST)
    try:
        token, raw = tokens.issue_token(request.user, name=name, scopes=request.POST.getlist("scopes"))
    except tokens.KeyRefused as exc:
        return _page(request, error=exc, status=HTTPStatus.BAD_REQUEST)
    return _page(request, created=token, raw_key=raw, status=HTTPStatus.CREATED)


@never_cache
@login_required
@require_POST
def revoke(request: HttpRequest, key_id: int) -> HttpResponse:
    """Revoke one of the user's own keys (another user's is a 404, as an unknown one: ids do not leak)."""
    user: Any = request.user
    key = tokens.key_of(user.pk, key_id)
    if key is None:
        raise Http404("no such key")
    if tokens.revoke_token(token_id=key.pk, user_id=user.pk):
        label = f"{key.prefix}… ({key.name})" if key.name else f"{key.prefix}…"
        messages.success(request, f"Revoked {label}: clients using it are disconnected.")
    response = redirect("api_keys")
    response.status_code = HTTPStatus.SEE_OTHER  # after a POST, the list by GET
    return response
