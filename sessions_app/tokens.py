"""API tokens: issue (raw value shown once), authenticate, revoke. Only hashes are stored."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from .models import ApiToken

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
    token = (
        ApiToken.objects.select_related("user")
        .filter(token_hash=hash_token(raw), revoked_at__isnull=True)
        .first()
    )
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
    return qs.update(revoked_at=timezone.now())


def get_or_create_user(username: str, *, create: bool) -> AbstractBaseUser | None:
    User = get_user_model()
    user = User.objects.filter(username=username).first()
    if user is None and create:
        user = User.objects.create_user(username=username)
    return user


def still_authorized(user_id: int, token_hash: str | None) -> bool:
    """Whether an open connection's identity still holds: user active, token not revoked."""
    if not get_user_model().objects.filter(pk=user_id, is_active=True).exists():
        return False
    if token_hash is None:
        return True
    return ApiToken.objects.filter(token_hash=token_hash, user_id=user_id, revoked_at__isnull=True).exists()
