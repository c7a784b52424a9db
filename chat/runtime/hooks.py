"""On-commit hooks from the lifecycle into this process's runtime.

They run on whatever thread committed and return at once; the work hops onto the
serving loop.
"""

from __future__ import annotations

import logging

from channels.layers import get_channel_layer

from chat.delivery import groups
from chat.delivery.broadcaster import broadcaster
from chat.delivery.messages import RunCancel
from chat.runtime.gateway import runtime
from sessions_app.models import Run

log = logging.getLogger(__name__)


def run_dispatching(run: Run, owner_process: str) -> None:
    """A run became active: execute it here when this process owns it (as committed, with its session)."""
    if owner_process and owner_process == runtime.server_id and runtime.running:
        runtime.call_soon(runtime.executor.submit, run.pk, run)


def run_ended(run_pk: int, owner_process: str) -> None:
    """An active run ended: stop its work wherever it executes."""
    if not owner_process:
        return
    if owner_process == runtime.server_id and runtime.running:
        runtime.call_soon(runtime.executor.cancel, run_pk)
        return
    # Another process owns it: route the cancel there (its reconcile loop is the backstop).
    if get_channel_layer() is not None:
        cancel: RunCancel = {"type": "run.cancel", "run": run_pk}
        broadcaster.route(groups.process_group(owner_process), cancel)


def run_changed(run_pk: int) -> None:
    """Wake local waiters (chat.send waitMs)."""
    if runtime.running:
        runtime.call_soon(runtime.executor.notify, run_pk)


def tool_changed(call_pk: int, run_pk: int) -> None:
    """A tool call or approval changed: wake what waits on its run here (a runner awaiting a decision)."""
    if runtime.running:
        runtime.call_soon(runtime.executor.notify, run_pk)
