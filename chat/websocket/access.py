"""Revocation that open sockets feel at once.

Logout, a password change, deactivation, a revoked API token and the loss of staff are
told to every connection of that user through its group (`user.<id>`, any process):
the connections that relied on what was revoked close with 4008; loss of staff takes
the admin scope (and a `scope:"all"` subscription) away. The tick re-check
(`sessions_app.tokens.current_access`) is the backstop for a message the layer dropped.
Receivers are connected in `ChatConfig.ready`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import partial
from typing import Any

from django.db import transaction

from chat.delivery import groups
from chat.delivery.broadcaster import broadcaster
from chat.delivery.messages import AccessMessage

# what changed → what it means for a connection
CLOSE_ALL = ("inactive",)
CLOSE_COOKIE = ("password",)
CLOSE_SESSION = ("logout",)
CLOSE_TOKEN = ("token",)
DOWNGRADE = ("demoted",)


def session_digest(session_key: str | None) -> str | None:
    """A login session's key as told through the layer: a digest, never the key itself."""
    return hashlib.sha256(session_key.encode()).hexdigest() if session_key else None


@dataclass
class Identity:
    """How one connection was authenticated."""

    token_hash: str | None = None
    session: str | None = None  # session_digest of the login session, for cookie sockets


def verdict(identity: Identity, message: AccessMessage) -> str | None:
    """'close', 'downgrade' or None for a connection told `message`."""
    change = message.get("change")
    if change in CLOSE_ALL:
        return "close"
    if change in CLOSE_COOKIE and identity.token_hash is None:
        return "close"
    if change in CLOSE_SESSION and identity.session is not None and identity.session == message.get("session"):
        return "close"
    if change in CLOSE_TOKEN and identity.token_hash is not None and identity.token_hash in message.get("tokens", ()):
        return "close"
    if change in DOWNGRADE:
        return "downgrade"
    return None


def tell(user_id: int, change: str, *, session: str | None = None, tokens: list[str] | None = None) -> None:
    """Tell every connection of `user_id` about `change`, once the current transaction commits."""
    message: AccessMessage = {"type": "gateway.access", "owner": user_id, "change": change}
    if change == "logout":
        message["session"] = session
    if tokens is not None:
        message["tokens"] = tokens
    transaction.on_commit(partial(broadcaster.route, groups.user_group(user_id), message), robust=True)


# --- receivers ---------------------------------------------------------------------------------------


def on_logged_out(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    session = getattr(request, "session", None)
    if user is not None and session is not None:
        tell(user.pk, "logout", session=session_digest(session.session_key))


def on_user_pre_save(sender: Any, instance: Any, raw: bool = False, **kwargs: Any) -> None:
    """Remember what revocation compares (the row as stored before this save)."""
    fields = kwargs.get("update_fields")
    if raw or instance.pk is None or (fields is not None and not {"password", "is_active", "is_staff"} & set(fields)):
        return  # e.g. the last_login update of every login: nothing revocation compares
    before = type(instance)._default_manager.filter(pk=instance.pk).values("password", "is_active", "is_staff").first()
    instance._agentgate_before = before


def on_user_saved(sender: Any, instance: Any, created: bool = False, raw: bool = False, **kwargs: Any) -> None:
    before = getattr(instance, "_agentgate_before", None)
    instance._agentgate_before = None
    if raw or created or before is None:
        return
    if before["is_active"] and not instance.is_active:
        tell(instance.pk, "inactive")
        return
    if before["password"] != instance.password:
        tell(instance.pk, "password")
    if before["is_staff"] and not instance.is_staff:
        tell(instance.pk, "demoted")


def on_tokens_revoked(sender: Any, tokens: list[tuple[int, str]], **kwargs: Any) -> None:
    by_user: dict[int, list[str]] = {}
    for user_id, token_hash in tokens:
        by_user.setdefault(user_id, []).append(token_hash)
    for user_id, hashes in by_user.items():
        tell(user_id, "token", tokens=hashes)
