"""API keys (tokens): issue (raw value shown once), authenticate, revoke. Only hashes are stored.

The one writer of keys: the page, the admin and the commands make and revoke them here, so the
rules (scopes, the staff-only `admin`, a user's limit, the name) and the revocation signal live once."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import connection, transaction
from django.db.models import QuerySet
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from sessions_app.models import ApiToken, KeyScope, default_key_scopes
from sessions_app.signals import tokens_revoked

TOKEN_PREFIX = "agt_"
NAME_MAX = ApiToken._meta.get_field("name").max_length or 100
READ_ONLY = (KeyScope.READ.value,)
SCOPE_ORDER = tuple(scope.value for scope in KeyScope)  # read, write, approvals, admin


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


class KeyRefused(Exception):
    """A key that cannot be made as asked (nothing was stored); `field` names what to change."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


def parse_scopes(values: Iterable[Any]) -> list[str]:
    """A key's scopes as given (values of KeyScope), each once and in KeyScope's order; raise KeyRefused.

    Every key has `read`: without it a client could change what it cannot list or look at."""
    given = [v.strip() if isinstance(v, str) else v for v in values]
    unknown = [str(v) for v in given if v not in SCOPE_ORDER]
    if unknown:
        raise KeyRefused(f"unknown scope {unknown[0]!r} (the scopes are {', '.join(SCOPE_ORDER)})", "scopes")
    if KeyScope.READ not in given:
        raise KeyRefused("every key has the read scope (read alone makes a read-only key)", "scopes")
    return [scope for scope in SCOPE_ORDER if scope in given]


def max_active_keys() -> int:
    """How many unrevoked keys one user may hold (GATEWAY_MAX_API_KEYS_PER_USER)."""
    return int(settings.GATEWAY_MAX_API_KEYS_PER_USER)


def check_key(
    user: Any, *, name: str = "", scopes: Iterable[Any] | None = None, staff: bool | None = None
) -> tuple[str, list[str]]:
    """The name and scopes a new key of `user` gets (the rules of every new key); raise KeyRefused.

    `scopes` defaults to the model's (read, write, approvals); `admin` only for a staff user's key
    (`staff` as `issue_token` read it under its lock, else the user's); at most `max_active_keys()`
    unrevoked keys per user. A form checks with it first; `issue_token` checks again, under the lock."""
    name = name.strip()
    if len(name) > NAME_MAX:
        raise KeyRefused(f"the name is longer than {NAME_MAX} characters", "name")
    if any(ch < " " or ch == "\x7f" for ch in name):
        raise KeyRefused("the name has control characters", "name")
    chosen = parse_scopes(default_key_scopes() if scopes is None else scopes)
    if KeyScope.ADMIN in chosen and not (user.is_staff if staff is None else staff):
        raise KeyRefused("only a staff user's key may have the admin scope", "scopes")
    limit = max_active_keys()
    if ApiToken.objects.filter(user_id=user.pk, revoked_at__isnull=True).count() >= limit:
        raise KeyRefused(f"at most {limit} active keys per user: revoke one first")
    return name, chosen


def issue_token(user: Any, *, name: str = "", scopes: Iterable[Any] | None = None) -> tuple[ApiToken, str]:
    """Create a key for `user` (`check_key`'s rules); return the row and the raw key (never stored).
    Raise KeyRefused. The user's row is locked meanwhile, so two requests at once cannot both take
    a user's last place."""
    with transaction.atomic():
        locked = get_user_model().objects.select_for_update().filter(pk=user.pk).values_list("is_staff", flat=True)
        staff = list(locked)
        if not staff:
            raise KeyRefused("no such user", "user")
        name, chosen = check_key(user, name=name, scopes=scopes, staff=staff[0])
        raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = ApiToken.objects.create(
            user=user, name=name, prefix=raw[:12], token_hash=hash_token(raw), scopes=chosen
        )
    return token, raw


@dataclass(frozen=True)
class KeyHolder:
    """Who an API key acts as, and what it may do (HTTP-API.md §14.1)."""

    token_id: int
    token_hash: str
    user_id: int
    username: str
    is_staff: bool
    scopes: frozenset[str]  # KeyScope values


def find_key(raw: str | None) -> KeyHolder | None:
    """The holder of this unrevoked key of an active user, or None (the same answer for wrong and
    missing). A read: `note_use` records the use apart, so a request's check costs no write."""
    if not raw or not isinstance(raw, str) or len(raw) > 200:
        return None
    token = (
        ApiToken.objects.select_related("user")
        .filter(token_hash=hash_token(raw), revoked_at__isnull=True, user__is_active=True)
        .first()
    )
    if token is None:
        return None
    return KeyHolder(
        token.pk,
        token.token_hash,
        token.user_id,
        token.user.get_username(),
        token.user.is_staff,
        frozenset(token.scopes),
    )


def note_use(token_id: int) -> None:
    """Record that a key was used now (its `last_used_at`)."""
    ApiToken.objects.filter(pk=token_id).update(last_used_at=timezone.now())


def use_key(raw: str | None) -> KeyHolder | None:
    """`find_key`, and its use recorded when it is found (a connection's handshake)."""
    holder = find_key(raw)
    if holder is not None:
        note_use(holder.token_id)
    return holder


def authenticate_token(raw: str | None) -> AbstractBaseUser | None:
    """The active user owning this unrevoked token, or None (same answer for wrong and missing)."""
    holder = use_key(raw)
    return None if holder is None else get_user_model().objects.filter(pk=holder.user_id).first()


def revoke_token(*, token_id: int | None = None, prefix: str | None = None, user_id: int | None = None) -> int:
    """Revoke by id or by the printed prefix, of `user_id`'s keys only when given; return how many
    keys were revoked (an already revoked one counts 0). Open connections using them are closed."""
    qs = ApiToken.objects.filter(revoked_at__isnull=True)
    if token_id is not None:
        qs = qs.filter(pk=token_id)
    elif prefix:
        qs = qs.filter(prefix__startswith=prefix)
    else:
        return 0
    if user_id is not None:
        qs = qs.filter(user_id=user_id)
    with transaction.atomic():
        found = list(qs.select_for_update().values_list("pk", "user_id", "token_hash"))
        count = ApiToken.objects.filter(pk__in=[pk for pk, _u, _h in found]).update(revoked_at=timezone.now())
        # open connections using them are closed at once (the gateway listens)
        tokens_revoked.send(sender=ApiToken, tokens=[(owner, token_hash) for _pk, owner, token_hash in found])
    return count


# --- reads of a user's own keys (the keys page) -------------------------------------------------------

REVOKED_SHOWN = 20  # the most recently revoked keys a user's list still shows


def keys_of(user_id: int) -> list[ApiToken]:
    """A user's active keys, then the `REVOKED_SHOWN` most recently revoked ones; newest first in each."""
    mine = ApiToken.objects.filter(user_id=user_id).defer("token_hash")
    active = list(mine.filter(revoked_at__isnull=True).order_by("-id"))
    revoked = list(mine.filter(revoked_at__isnull=False).order_by("-revoked_at", "-id")[:REVOKED_SHOWN])
    return active + revoked


def having_scope(keys: QuerySet[ApiToken], scope: str) -> QuerySet[ApiToken]:
    """The keys among `keys` that have `scope` (a KeyScope value); `read-only` for read alone."""
    if scope == "read-only":
        return keys.filter(scopes=list(READ_ONLY))
    if scope not in SCOPE_ORDER:
        return keys.none()
    if connection.features.supports_json_field_contains:
        return keys.filter(scopes__contains=[scope])  # PostgreSQL's jsonb @>: no text made of every row
    return keys.filter(scopes__icontains=f'"{scope}"')  # SQLite: the stored JSON text holds the name quoted


def key_of(user_id: int, token_id: int) -> ApiToken | None:
    """One of the user's own keys (revoked or not), or None: another user's key is not theirs to see."""
    return ApiToken.objects.filter(user_id=user_id, pk=token_id).defer("token_hash").first()


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
