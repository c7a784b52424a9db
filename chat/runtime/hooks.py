"""On-commit hooks from the lifecycle receivers into this process's run manager.

They run on whatever thread committed; the manager hops onto its event loop.
"""

from __future__ import annotations

import logging

from channels.layers import get_channel_layer

from .. import delivery, groups
from .manager import run_manager

log = logging.getLogger(__name__)


def run_dispatching(run_pk: int, owner_process: str) -> None:
    """A run became active: execute it here when this process owns it."""
    if owner_process and owner_process == run_manager.server_id and run_manager.running:
        run_manager.call_threadsafe(run_manager.submit, run_pk)


def run_ended(run_pk: int, owner_process: str) -> None:
    """An active run ended: stop its work wherever it executes."""
    if not owner_process:
        return
    if owner_process == run_manager.server_id and run_manager.running:
        run_manager.call_threadsafe(run_manager.cancel, run_pk)
        return
    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": "run.cancel", "run": run_pk}
    if not delivery.call_from_thread(layer.group_send, groups.process_group(owner_process), message):
        # the owner's reconcile loop is the backstop
        log.warning("could not route cancel of run %s to %s", run_pk, owner_process)


def run_changed(run_pk: int, state: str) -> None:
    """Wake local waiters (chat.send waitMs)."""
    if run_manager.running:
        run_manager.call_threadsafe(run_manager.notify, run_pk)
