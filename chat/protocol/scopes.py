"""Operator scopes (§2.4) and the `connect` caps this gateway acts on."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from sessions_app.models import KeyScope


class Scope(StrEnum):
    """Operator scopes (§2.4); each method declares the one it needs."""

    READ = "operator.read"
    WRITE = "operator.write"
    ADMIN = "operator.admin"
    APPROVALS = "operator.approvals"  # see and answer one's own tool approvals (TOOLS.md §13.5)


# What each scope of an API key lets its clients have (HTTP-API.md §14.1): at most these, on either door.
OF_KEY: dict[str, Scope] = {
    KeyScope.READ: Scope.READ,
    KeyScope.WRITE: Scope.WRITE,
    KeyScope.APPROVALS: Scope.APPROVALS,
    KeyScope.ADMIN: Scope.ADMIN,
}


def of_key(key_scopes: Iterable[str]) -> frozenset[str]:
    """The operator scopes a key with these KeyScope values may grant (unknown values grant nothing)."""
    return frozenset(OF_KEY[s].value for s in key_scopes if s in OF_KEY)


# `connect` caps this gateway acts on: `tool-events` asks for the `agent` stream `tool` (§13.3)
CAP_TOOL_EVENTS = "tool-events"
