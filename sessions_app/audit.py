"""Who acted: the operator behind an admin request or a command, for the audit rows.

The lifecycle service records `actor` (user, system, operator, reaper); which operator
it was travels beside it in a context variable, set once per admin request (middleware)
or per command, and read by the receivers that write the audit rows and tombstones (`audit_trail`).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest, HttpResponse

log = logging.getLogger("sessions_app.audit")


@dataclass(frozen=True)
class Operator:
    user_id: int | None
    name: str


_operator: contextvars.ContextVar[Operator | None] = contextvars.ContextVar("agentgate_operator", default=None)
_deletion_reason: contextvars.ContextVar[str] = contextvars.ContextVar("agentgate_deletion_reason", default="delete")


def current_operator() -> Operator | None:
    return _operator.get()


def deletion_reason() -> str:
    return _deletion_reason.get()


@contextlib.contextmanager
def acting_as(user_id: int | None, name: str) -> Iterator[Operator]:
    """Attribute the audit rows written inside the block to this operator."""
    operator = Operator(user_id, name)
    token = _operator.set(operator)
    try:
        yield operator
    finally:
        _operator.reset(token)


@contextlib.contextmanager
def deleting_because(reason: str) -> Iterator[None]:
    """Sessions deleted inside the block get tombstones with this reason (e.g. `prune`)."""
    token = _deletion_reason.set(reason)
    try:
        yield
    finally:
        _deletion_reason.reset(token)


class OperatorMiddleware:
    """Staff requests (the admin) run as their user, so their audit rows name them."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        user: Any = getattr(request, "user", None)
        if user is None or not getattr(user, "is_staff", False):
            return self.get_response(request)
        with acting_as(user.pk, user.get_username()):
            return self.get_response(request)
