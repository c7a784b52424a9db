"""Runs: admission of a send, and each step of a run's life up to its one terminal state."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any, Literal

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from sessions_app import files, gateway_reads, statements
from sessions_app.lifecycle import branches, steering
from sessions_app.lifecycle import usage as accounting  # (`finish_run` has a parameter named usage)
from sessions_app.lifecycle.branches import Regeneration
from sessions_app.lifecycle.core import (
    OUTCOME_FIELDS,
    REASON_FOR_STATE,
    LifecycleError,
    Reply,
    dispatch_stamp,
    emit_run,
    kill,
    lock_or_create_session,
    lock_run,
    next_queue_seq,
    save_row,
    start_inserted,
    take_outcome,
    transition,
)
from sessions_app.models import (
    ACTIVE_STATES,
    OPEN_STATES,
    STEER,
    Actor,
    ChatSession,
    Run,
    RunErrorKind,
    RunState,
    RunSurface,
    SessionKind,
)

# What admission decided: a new run started or queued, the key's existing run, a key reused
# with another body, a full queue, or a send that failed before its ack (kept as a failed run).
# A steer taken by the active run's queue is `steered` (`lifecycle.steering`); a send over a budget
# (`budget`) admitted nothing.
Admission = Literal["started", "queued", "steered", "existing", "conflict", "queue_full", "rejected", "budget"]


@dataclass
class SendRequest:
    """A validated send, ready for admission."""

    owner_id: int
    key: str
    agent_id: str
    run_id: str
    message: str
    body_hash: str
    timeout_ms: int
    attachments: list[dict[str, Any]] = field(default_factory=list)
    queue_mode: str = "followup"
    interrupt_reason: str = "interrupt"  # stopReason for the run an interrupt replaces
    setup_error: str | None = None  # a failure found before the ack (§4)
    surface: str = RunSurface.WEBSOCKET  # the door it came in by
    request: dict[str, Any] | None = None  # what an HTTP request adds (`RunRequest.as_json`)
    session_kind: str = SessionKind.DIRECT  # the kind of a session this send creates
    # called with a newly admitted run (started, queued or failed at admission) in the admitting
    # transaction: what must exist with the run and never without it (a Responses API row)
    on_admitted: Callable[[Run], None] | None = None
    # the runId is the owner's idempotency key in every session, not only in this one (the HTTP
    # API's `Idempotency-Key`, HTTP-API.md §14.6): a key another session's HTTP run has is that run
    owner_scoped_key: bool = False
    # the session as the gateway read it just before, the key new to it (`statements.keyed_run`: its
    # row, runIds and queue): admitted against it when it is still so (`_admit_seen`)
    seen: ChatSession | None = None
    # queue mode `steer`: whether the agent's backend takes steering messages at all (the rest of the
    # rule is `steering.can_take`)
    steerable: bool = False
    # `expectedLeafEntryId` (`check_leaf`): admitted only while the session's active leaf is
    # `expected_leaf` (None: an empty active branch), else INVALID_REQUEST `active-leaf-changed`
    check_leaf: bool = False
    expected_leaf: int | None = None
    # chat.regenerate: the run starts a sibling branch of this message (`lifecycle.branches`)
    regeneration: Regeneration | None = None
    # the message the run's user message follows instead of the active leaf (a `previous_response_id`)
    follows: int | None = None
    # what the run is reserved against the budgets that apply (`lifecycle.usage`); None: not counted
    estimate: accounting.Estimate | None = None


@dataclass
class SendOutcome:
    admission: Admission
    run: Run | None
    session: ChatSession
    queue_position: int | None = None
    interrupted_active_run: bool = False
    steered_into: Run | None = None  # `steered`: the active run that is to take it
    over_budget: accounting.OverBudget | None = None  # the budget that refused the send (admission `budget`)


def replay_of(run: Run, session: ChatSession, body_hash: str, queue_position: Callable[[], int | None]) -> SendOutcome:
    """A send under a key its session already has (§4): that run again, or a conflict when the send
    differs from the one that made it (nothing runs, the run is untouched). THE rule of a reused key:
    the gateway's read-only answer and admission under the lock both apply it."""
    if run.body_hash != body_hash:
        return SendOutcome("conflict", run, session)
    return SendOutcome("existing", run, session, queue_position())


def admit_send(req: SendRequest, *, owner_process: str, actor: str = Actor.USER) -> SendOutcome:
    """Admit one send: its key's existing run, a conflict, a failure, a queued run or a started one.

    A started run is owned by `owner_process` (the process that will execute it, or '').
    A send over a budget admits nothing (its transaction, a new session's too, is undone).
    """
    try:
        return _admit_send(req, owner_process=owner_process, actor=actor)
    except accounting.OverBudget as over:
        session = req.seen or ChatSession(owner_id=req.owner_id, key=req.key, agent_id=req.agent_id)
        return SendOutcome("budget", None, session, over_budget=over)


def _admit_send(req: SendRequest, *, owner_process: str, actor: str) -> SendOutcome:
    # budgets apply: the reservation and the run go in under the session's lock (not `_admit_seen`)
    budgeted = req.estimate is not None and req.setup_error is None and accounting.budgets_may_apply()
    with transaction.atomic():
        if req.owner_scoped_key:
            # Two requests racing under one key may name different sessions (each holding only its own
            # lock): the key's lock makes the second wait, then find the first one's run.
            statements.lock_name(f"run-key:{req.owner_id}:{req.run_id}")
            keyed = gateway_reads.find_http_run(req.owner_id, req.run_id)
            if keyed is not None:
                return replay_of(keyed, keyed.session, req.body_hash, lambda: gateway_reads.queue_position(keyed))
        elif req.seen is not None and req.setup_error is None and req.regeneration is None and not budgeted:
            admitted = _admit_seen(req, req.seen, owner_process=owner_process, actor=actor)
            if admitted is not None:
                return admitted
        session = lock_or_create_session(
            owner_id=req.owner_id, key=req.key, agent_id=req.agent_id, actor=actor, kind=req.session_kind
        )
        existing = statements.run("r.session_id = %s AND r.run_id = %s", [session.pk, req.run_id])
        if existing is not None:
            return replay_of(existing, session, req.body_hash, lambda: gateway_reads.queue_position(existing))

        if req.check_leaf and session.active_leaf_id != req.expected_leaf:
            raise LifecycleError(
                "INVALID_REQUEST", "active branch changed; review and retry", reason="active-leaf-changed"
            )
        base = _fields(req, session)
        sibling = branches.sibling_of(session, req.regeneration) if req.regeneration is not None else None
        if sibling is not None:
            base.update(message=sibling.message, attachments=sibling.attachments, prompt_id=sibling.prompt_id)
        if req.setup_error is not None:
            failed = _admit_failed(session, base, req.setup_error, actor)
            if failed.run is not None:
                _admitted(req, failed.run)
            return failed
        if sibling is not None and sibling.leaf_id != session.active_leaf_id:
            # the sibling branch starts where its first message goes (no run is open: `sibling_of`)
            branches.move_leaf(session, sibling.leaf_id, reason="regenerate", actor=actor)

        active = statements.run("r.id = %s", [session.active_run_id]) if session.active_run_id else None
        if active is not None and req.queue_mode != "interrupt":
            queue = statements.known_queue(session)
            queued = (
                len(queue) if queue is not None else Run.objects.filter(session=session, state=RunState.QUEUED).count()
            )
            if queued >= settings.GATEWAY_QUEUE_MAX:
                return SendOutcome("queue_full", None, session)
            if budgeted:
                base["budget"] = _reserve(req, session)
            # a steer the run cannot take now waits for the run's end, as a follow-up
            if req.queue_mode == STEER and req.steerable and steering.can_take(session, active):
                steer = steering.queue_steer(session, base, actor=actor)
                _admitted(req, steer)
                return SendOutcome("steered", steer, session, steered_into=active)
            run = statements.insert(Run(state=RunState.QUEUED, queue_seq=next_queue_seq(session), stream_seq=1, **base))
            return _queued(req, run, session, actor)

        if budgeted:
            base["budget"] = _reserve(req, session)
        interrupted = False
        if active is not None:
            interrupted = kill(
                active,
                session,
                stop_reason=req.interrupt_reason,
                actor=actor,
                owner_process=owner_process,
                start_next=False,
            )
        run = statements.insert(
            Run(
                state=RunState.DISPATCHING,
                queue_seq=next_queue_seq(session),
                stream_seq=1,
                **dispatch_stamp(owner_process),
                **base,
            )
        )
        return _started(req, run, session, actor, interrupted=interrupted)


def _reserve(req: SendRequest, session: ChatSession) -> dict[str, Any] | None:
    """The run's reservation against every budget that applies (raises `accounting.OverBudget`)."""
    assert req.estimate is not None
    return accounting.reserve(req.owner_id, req.agent_id, req.estimate, session)


def _fields(req: SendRequest, session: ChatSession) -> dict[str, Any]:
    """A new run's fields from its send."""
    return dict(
        session=session,
        run_id=req.run_id,
        session_generation=session.session_id,
        message=req.message,
        body_hash=req.body_hash,
        attachments=req.attachments,
        timeout_ms=req.timeout_ms,
        # a steer is stored `steer` only while it waits for the active run (`steering.queue_steer`)
        queue_mode="followup" if req.queue_mode == STEER else req.queue_mode,
        created_by_id=req.owner_id,
        surface=req.surface,
        request=req.request,
        follows_id=req.follows,
    )


def _admit_seen(req: SendRequest, session: ChatSession, *, owner_process: str, actor: str) -> SendOutcome | None:
    """Admission against the session as the gateway read it just before (`SendRequest.seen`): the run
    starts in its free slot or joins its queue, inserted by the one statement that checks the session
    is still so (its `version` and active run: any committed change of its row or queue moves its
    `version`) and takes its lock. None, with nothing written, when it is not (or when the send needs
    more than the row: an interrupt, a queue that may be full): admission under the lock decides."""
    queue = statements.known_queue(session)
    if req.check_leaf and session.active_leaf_id != req.expected_leaf:
        return None  # decided under the lock, with the row as it is then
    if queue is None or (
        session.active_run_id is not None and (req.queue_mode != "followup" or len(queue) >= settings.GATEWAY_QUEUE_MAX)
    ):
        return None
    if session.active_run_id is None:
        run = Run(state=RunState.DISPATCHING, stream_seq=1, **dispatch_stamp(owner_process), **_fields(req, session))
    else:
        run = Run(state=RunState.QUEUED, stream_seq=1, **_fields(req, session))
    if not statements.insert_run_if_current(run, session):
        return None
    if run.state == RunState.DISPATCHING:
        return _started(req, run, session, actor, interrupted=False)
    return _queued(req, run, session, actor)


def _started(req: SendRequest, run: Run, session: ChatSession, actor: str, *, interrupted: bool) -> SendOutcome:
    _admitted(req, run)
    start_inserted(run, session, reason="send", actor=actor)
    return SendOutcome("started", run, session, interrupted_active_run=interrupted)


def _queued(req: SendRequest, run: Run, session: ChatSession, actor: str) -> SendOutcome:
    _admitted(req, run)
    queue = statements.known_queue(session)
    if queue is not None and run.run_id not in queue:
        queue.append(run.run_id)
    save_row(session)
    emit_run(run, session, from_state="", to_state=RunState.QUEUED, reason="queued", actor=actor, row_changed=True)
    return SendOutcome(
        "queued", run, session, queue.index(run.run_id) + 1 if queue is not None else gateway_reads.queue_position(run)
    )


def _admitted(req: SendRequest, run: Run) -> None:
    files.link_run(run)  # the stored files its attachments name are in use while it is kept
    if req.on_admitted is not None:
        req.on_admitted(run)


def _admit_failed(session: ChatSession, base: dict[str, Any], error: str, actor: str) -> SendOutcome:
    """Persist a send that failed before its ack as a failed run (§4)."""
    run = Run.objects.create(
        state=RunState.FAILED,
        error_kind=RunErrorKind.DISPATCH,
        error_message=error,
        ended_at=timezone.now(),
        queue_seq=next_queue_seq(session),
        stream_seq=1,
        **base,
    )
    changed = False
    if session.active_run_id is None:
        # `running` iff an active run: a failed side-send never masks a live run.
        take_outcome(session, run)  # failed, this run, its error
        session.started_at = run.ended_at  # it never ran: it started and ended at once
        save_row(session, "started_at", *OUTCOME_FIELDS)
        changed = True
    emit_run(
        run,
        session,
        from_state="",
        to_state=RunState.FAILED,
        reason="chat.dispatch-error",
        actor=actor,
        row_changed=changed,
    )
    return SendOutcome("rejected", run, session)


def mark_running(run_pk: int) -> bool:
    """dispatching -> running; False when the run was already ended (an abort won) or is gone."""
    return start_reply(run_pk) is not None


def start_reply(run_pk: int, text: str | None = None, *, owner_process: str | None = None) -> int | None:
    """dispatching -> running, with the reply's first text when given (its first delta), in one
    compare-and-set: the seq of that delta (of the `running` event, without text); None when the run
    has ended (an abort won) or is gone.

    A run already `running` under `owner_process` is that caller's own earlier try, committed
    before its connection broke: it carries on, its text stored as any delta (`record_delta`).
    """
    with transaction.atomic():
        found = lock_run(run_pk)
        if found is None:
            return None
        session, run = found
        if run.state == RunState.RUNNING and owner_process is not None and run.owner_process == owner_process:
            return run.stream_seq if text is None else record_delta(run_pk, text)
        started = transition(
            run,
            RunState.RUNNING,
            session=session,
            reason="run.running",
            actor=Actor.SYSTEM,
            owner_process=run.owner_process,
            text=None if text is None else Reply(text),
        )
        return run.stream_seq if started else None


# The reply's length after each delta is appended to `marks` (the delta boundaries a resumed Responses
# stream replays, HTTP-API.md §14.5) in the same statement: a JSON array append in each database's own
# terms (`marks` is text holding JSON on SQLite, jsonb on PostgreSQL). Only HTTP runs need them, so a
# WebSocket run's row stays as it was.
_APPEND_MARK = {
    "sqlite": "json_insert(marks, '$[#]', %s)",
    "postgresql": "marks || to_jsonb(%s::integer)",
}


@cache
def _record_delta_sql(vendor: str) -> str:
    return (
        f"UPDATE {Run._meta.db_table} SET reply = %s, stream_seq = stream_seq + 1, "
        f"marks = CASE WHEN surface = %s THEN {_APPEND_MARK[vendor]} ELSE marks END "
        f"WHERE id = %s AND state IN (%s, %s) RETURNING stream_seq"
    )


def record_delta(run_pk: int, text: str) -> int | None:
    """Store the accumulated text of an active run (and, for an HTTP run, its length as the next mark);
    return the delta's seq, or None if it ended.

    One statement (compare-and-set plus RETURNING; SQLite >= 3.35 and PostgreSQL): this
    is the hot path of every streaming run.
    """
    with connection.cursor() as cursor:
        cursor.execute(_record_delta_sql(connection.vendor), [text, RunSurface.HTTP, len(text), run_pk, *ACTIVE_STATES])
        row = cursor.fetchone()
    return None if row is None else int(row[0])


def finish_run(
    run_pk: int,
    to_state: str,
    *,
    owner_process: str,
    reply: str | None = None,
    stop_reason: str = "",
    error_kind: str = "",
    error_message: str = "",
    reason: str | None = None,
    actor: str = Actor.SYSTEM,
    usage: dict[str, int] | None = None,
    calls: list[accounting.CallUsage] | None = None,
    unknown_call: bool = False,
    cancel_ms: int | None = None,
    streamed: bool = False,
    announce_reply: Callable[[int], None] | None = None,
) -> bool:
    """End a run (done / failed / timeout / killed). First terminal wins; False if it lost.

    `streamed`: the backend's stream had begun, so a run still `dispatching` (its `running` not
    written yet) ends through `running`, a step of its own (`core.transition`'s `via`).
    `calls`: the model calls whose usage is recorded with the run's end (`lifecycle.usage`);
    `unknown_call`: the run was mid-call when its process died (a call of unknown usage).
    `announce_reply`: `reply` is also the rest of the reply not sent yet, announced as a delta
    before the run's end (called in the transaction with that delta's seq, to send it after commit).

    A run whose session was deleted meanwhile has already ended (`killed`, stopReason
    `delete`): that is its terminal, and this returns False quietly.
    """
    # the usage rows go in with the audit rows (`inserts_together`), before the commit
    with transaction.atomic(), statements.inserts_together():
        found = lock_run(run_pk)
        if found is None:
            return False
        session, run = found
        if unknown_call and run.state in ACTIVE_STATES:
            calls = [*(calls or []), accounting.unknown_call(run)]
        if calls and run.state in ACTIVE_STATES:
            # the end saves the row (its outcome) when the run is its active run of this generation
            saved = session.active_run_id == run.pk and run.session_generation == session.session_id
            accounting.record_calls(run, session, calls, save_row=save_row, row_saved_later=saved, at_end=True)
        values: dict[str, Any] = {"stop_reason": stop_reason, "error_kind": error_kind, "error_message": error_message}
        text = None
        if reply is not None and announce_reply is not None:
            text = Reply(reply, announce_reply)
        elif reply is not None:
            values["reply"] = reply
        if usage:
            values["prompt_tokens"] = usage.get("prompt_tokens")
            values["completion_tokens"] = usage.get("completion_tokens")
        if cancel_ms is not None:
            values["cancel_ms"] = cancel_ms
        # a run can be `done` only once it ran
        through = streamed or to_state == RunState.DONE
        return transition(
            run,
            to_state,
            session=session,
            reason=reason or REASON_FOR_STATE[RunState(to_state)],
            actor=actor,
            owner_process=owner_process,
            via=RunState.RUNNING if through and run.state == RunState.DISPATCHING else None,
            text=text,
            **values,
        )


def record_step(run_pk: int, call: accounting.CallUsage, then_call: bool = True) -> bool | None:
    """Record a model call that ended mid-run (a step before its tool calls run), in its own
    transaction; True when a budget of the run is now spent or, `then_call` (the run means to ask
    its model again after the tools), cannot take that call: it must stop before its tools. None
    when the run has ended."""
    with transaction.atomic():
        found = lock_run(run_pk)
        if found is None or found[1].state not in ACTIVE_STATES:
            return None
        session, run = found
        return accounting.record_calls(run, session, [call], save_row=save_row, then_call=then_call)


def interrupt_run(run_pk: int, *, message: str, owner_process: str = "", actor: str = Actor.REAPER) -> bool:
    """End a run whose process died or stopped: failed, errorKind interrupted (§8)."""
    return finish_run(
        run_pk,
        RunState.FAILED,
        owner_process=owner_process,
        error_kind=RunErrorKind.INTERRUPTED,
        error_message=message,
        reason="run.interrupted",
        actor=actor,
        unknown_call=True,
    )


def interrupt_runs_of_process(server_id: str, *, message: str, actor: str = Actor.REAPER) -> list[int]:
    """End every active run owned by a dead or stopping process as failed/interrupted.

    Their queued successors start unowned, for a live process to claim.
    """
    pks = list(Run.objects.filter(owner_process=server_id, state__in=ACTIVE_STATES).values_list("pk", flat=True))
    return [pk for pk in pks if interrupt_run(pk, message=message, actor=actor)]


def claim_run(run_pk: int, *, server_id: str) -> bool:
    """Take ownership of an active run nobody executes (started by a process without a runtime)."""
    with transaction.atomic():
        return bool(
            Run.objects.filter(pk=run_pk, state=RunState.DISPATCHING, owner_process__in=["", server_id]).update(
                owner_process=server_id
            )
        )


def record_cancel_ms(run_pk: int, elapsed_ms: int) -> None:
    """Record how long stopping an aborted run's backend work took (not a state change)."""
    Run.objects.filter(pk=run_pk).update(cancel_ms=elapsed_ms)


# --- HTTP runs without their client (HTTP-API.md §14.4, §14.6) --------------------------------

DISCONNECT = "disconnect"  # the stopReason of a run whose HTTP client left


def set_detached(run_pk: int, detached: bool) -> bool:
    """Mark an open HTTP run as without its client since now (a retry under its key may reattach),
    or as attached again; False if the run has ended (or is gone, or was already so)."""
    runs = Run.objects.filter(pk=run_pk, state__in=OPEN_STATES)
    if detached:
        return bool(runs.filter(detached_at__isnull=True).update(detached_at=timezone.now()))
    return bool(runs.filter(detached_at__isnull=False).update(detached_at=None))


def abort_detached(*, cutoff: datetime, owner_process: str, limit: int = 100) -> list[str]:
    """Abort the open runs left without a client since before `cutoff` (stopReason `disconnect`);
    their runIds. Checked again under the session lock: a retry may have reattached meanwhile."""
    pks = list(Run.objects.filter(detached_at__lt=cutoff, state__in=OPEN_STATES).values_list("pk", flat=True)[:limit])
    ended: list[str] = []
    for pk in pks:
        with transaction.atomic():
            found = lock_run(pk)
            if found is None:
                continue
            session, run = found
            if run.detached_at is None or run.detached_at >= cutoff:
                continue
            if kill(
                run, session, stop_reason=DISCONNECT, actor=Actor.SYSTEM, owner_process=owner_process, start_next=True
            ):
                ended.append(run.run_id)
    return ended
