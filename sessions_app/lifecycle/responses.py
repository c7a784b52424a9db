"""Responses API rows (HTTP-API.md §14.5): recorded with the run that answers them, and forgotten.

A response row holds what its request fixed (id, model, input items, metadata, store, background,
the response it continues); its status, output and events are derived from its run, so nothing
here changes run state. The row is written inside the transaction that admits its run
(`SendRequest.on_admitted`), so a response never exists without its run, nor a run of a response
request without its response. Forgetting one (DELETE) removes the row only: the run and the
session's transcript stay, as for any run.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from sessions_app.models import ApiResponse, Run

audit = logging.getLogger("sessions_app.audit")


def new_response_id() -> str:
    """`resp_` and 32 hex digits."""
    return f"resp_{secrets.token_hex(16)}"


@dataclass
class ResponseSpec:
    """What a Responses request fixes about its response."""

    owner_id: int
    model: str  # as the request named it
    store: bool = True
    background: bool = False
    previous_response_id: str = ""
    input_items: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)


class Recorder:
    """Writes a run's response row; admission calls it with a newly admitted run, in its transaction.

    `row` is the response it wrote (None when admission made no new run: a retry under a known
    Idempotency-Key finds its response by its run instead).
    """

    def __init__(self, spec: ResponseSpec) -> None:
        self.spec = spec
        self.row: ApiResponse | None = None

    def __call__(self, run: Run) -> None:
        spec = self.spec
        self.row = ApiResponse.objects.create(
            response_id=new_response_id(),
            owner_id=spec.owner_id,
            run=run,
            model=spec.model[:200],
            store=spec.store,
            background=spec.background,
            previous_response_id=spec.previous_response_id,
            input_items=spec.input_items,
            metadata=spec.metadata,
        )


def recorder(spec: ResponseSpec) -> Recorder:
    return Recorder(spec)


def forget(*, owner_id: int, response_id: str) -> bool:
    """DELETE: the caller's stored response is forgotten (its run and transcript stay); False when
    there is none to forget (unknown, another user's, already deleted, or never stored)."""
    with transaction.atomic():
        deleted, _ = ApiResponse.objects.filter(response_id=response_id, owner_id=owner_id, store=True).delete()
    if deleted:
        audit.info("response %s forgotten by its owner (user %s)", response_id, owner_id)
    return bool(deleted)
