"""API tokens: issue (raw value shown once), authenticate, revoke. Only hashes are stored."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from sessions_app.models import ApiToken
from sessions_app.signals import tokens_revoked

TOKEN_PREFIX = "agt_"


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def issue_token(user: Any, *, name: str = "") -> tuple[ApiToken, str]:
    """Create a token for `user`; return the row and the raw token (never stored)."""
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(user=user, name=name, prefix=raw[:12], token_hash=hash_token(raw))
    return token, raw


def authenticate_token(raw: str | None) -> AbstractBaseUser | None:
    """The active user owning this unrevoked token, or None (same answer for wrong and missing)."""
    if not raw or not isinstance(raw, str) or len(raw) > 200:
        return None
    token = ApiToken.objects.select_related("user").filter(token_hash=hash_token(raw), revoked_at__isnull=True).first()
    if token is None or not token.user.is_active:
        return None
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
    return token.user


def revoke_token(*, token_id: int | None = None, prefix: str | None = None) -> int:
    """Revoke by id or by the printed prefix; return how many tokens were revoked."""
    qs = ApiToken.objects.filter(revoked_at__isnull=True)
    if token_id is not None:
        qs = qs.filter(pk=token_id)
    elif prefix:
        qs = qs.filter(prefix__startswith=prefix)
    else:
        return 0
    with transaction.atomic():
        found = list(qs.select_for_update().values_list("pk", "user_id", "token_hash"))
        count = ApiToken.objects.filter(pk__in=[pk for pk, _u, _h in found]).update(revoked_at=timezone.now())
        # open connections using them are closed at once (the gateway listens)
        tokens_revoked.send(sender=ApiToken, tokens=[(user_id, token_hash) for _pk, user_id, token_hash in found])
    return count


def get_or_create_user(username: str, *, create: bool) -> AbstractBaseUser | None:
    User = get_user_model()
    user = User.objects.filter(username=username).first()
    if user is None and create:
        user = User.objects.create_user(username=username)
    return user


def still_authorized(user_id: int, token_hash: str | None) -> bool:
    """Whether an open connection's identity still holds: user active, token not revoked."""
    return current_access(user_id, token_hash, None).valid


@dataclass(frozen=True)
class Access:
    """What an open connection's identity still allows."""

    valid: bool
    staff: bool = False


def current_access(user_id: int, token_hash: str | None, session_key: str | None) -> Access:
    """Re-check an open connection: active user; its token unrevoked, or its login session
    still there and still signed with the user's password (logout and a password change end it)."""
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    if user is None:
        return Access(False)
    if token_hash is not None:
        valid = ApiToken.objects.filter(token_hash=token_hash, user_id=user_id, revoked_at__isnull=True).exists()
    elif session_key:
        valid = session_still_valid(user, session_key)
    else:
        valid = True  # neither a token nor a login session: nothing else to re-check
    return Access(valid, bool(getattr(user, "is_staff", False)))


def session_still_valid(user: Any, session_key: str) -> bool:
    """Whether the login session `session_key` still logs `user` in, as Django's own check says."""
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    data = store.load()
    if str(data.get(SESSION_KEY)) != str(user.pk):
        return False
    stored = data.get(HASH_SESSION_KEY)
    return bool(stored) and constant_time_compare(stored, user.get_session_auth_hash())
