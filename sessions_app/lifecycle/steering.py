"""Steering: a message sent into a session's working run (docs/protocol-notes.md, "Steering").

A steer is a run row of its own, queued with queue mode `steer` behind the active run (its key, its
body and its place in the queue are a queued run's). The run takes it at its next boundary
(`deliver`): the steer ends `killed` (stopReason `steered`: it will not run on its own, §8 lets a queued
run end no other way), the active run's reply so far is kept as
a part of its own and the steering message follows it in the transcript. A steer the run ends
without taking becomes a queued follow-up (`core.steers_to_followups`), started as any queued run;
`chat.abort` by its runId withdraws it while it waits (a queued run aborted).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from sessions_app import statements
from sessions_app.lifecycle.core import (
    append_message,
    emit_run,
    lock_run,
    next_queue_seq,
    queued_runs,
    reply_part,
    save_row,
    transition,
)
from sessions_app.models import (
    STEER,
    Actor,
    ChatSession,
    Message,
    Run,
    RunState,
)

STEERED = "steered"  # the stopReason of a steer its run took
SKIPPED_TEXT = "Skipped to process an incoming message."  # a call not started for it (OpenClaw's words)


@dataclass
class Delivered:
    """A steering message as its run's model is given it."""

    run_id: str
    message: str
    attachments: list[dict[str, Any]] = field(default_factory=list)


def can_take(session: ChatSession, active: Run) -> bool:
    """THE rule of whether the active run can take a steer now: it is running (not still being set up),
    of the current transcript, and not waiting on an approval. (Whether its backend takes steering at
    all is the caller's: it knows the backend.)"""
    return (
        active.state == RunState.RUNNING
        and active.session_generation == session.session_id
        and session.waiting_for == ""
    )


def queue_steer(session: ChatSession, fields: dict[str, Any], *, actor: str) -> Run:
    """Queue a steer for the locked session's active run (the caller checked `can_take`)."""
    run = statements.insert(
        Run(state=RunState.QUEUED, queue_seq=next_queue_seq(session), stream_seq=1, **{**fields, "queue_mode": STEER})
    )
    queue = statements.known_queue(session)
    if queue is not None and run.run_id not in queue:
        queue.append(run.run_id)
    save_row(session)
    emit_run(
        run, session, from_state="", to_state=RunState.QUEUED, reason="steer.queued", actor=actor, row_changed=True
    )
    return run


def deliver(run_pk: int, *, step: int, reply_text: str) -> list[Delivered] | None:
    """The steers waiting for the run, taken at the boundary after its step `step` (its reply so far
    `reply_text`), oldest first; None when the run is no longer running.

    In one transaction: the reply so far becomes a part of its own (`core.reply_part`), each steer
    ends (stopReason `steered`) and its message follows in the transcript. A step takes steers
    once: a retry whose earlier try committed (its answer lost) gets those steers back.

    Each steer ends `killed` with stopReason `steered`: §8's state machine lets a queued run end only
    failed, killed or timeout, and `done` would claim it ran.
    """
    with transaction.atomic():
        found = lock_run(run_pk)
        if found is None:
            return None
        session, run = found
        if run.state != RunState.RUNNING or session.active_run_id != run.pk:
            return None
        earlier = Message.objects.filter(run=run, role="assistant", last_step=step).first()
        if earlier is not None:
            taken = Message.objects.filter(session=session, pk__gt=earlier.pk, role="user", run__stop_reason=STEERED)
            return [
                Delivered(m.run.run_id, m.text, list(m.run.attachments or []))
                for m in taken.select_related("run")
                if m.run is not None
            ]
        steers = [r for r in queued_runs(session) if r.queue_mode == STEER]
        if not steers:
            return []
        reply_part(session, run, reply_text, last_step=step)
        delivered = []
        for steer in steers:
            if not transition(
                steer,
                RunState.KILLED,
                session=session,
                reason="run.steered",
                actor=Actor.SYSTEM,
                owner_process="",
                start_next=False,
                stop_reason=STEERED,
            ):
                continue
            message = Message(session=session, session_generation=session.session_id, role="user", text=steer.message)
            message.run = steer
            append_message(session, message)
            delivered.append(Delivered(steer.run_id, steer.message, list(steer.attachments or [])))
        run.steers += len(delivered)
        Run.objects.filter(pk=run.pk).update(steers=run.steers)  # under the session lock: nothing else writes it
        save_row(session, "active_leaf")  # the part and the steers joined the active branch
        return delivered
