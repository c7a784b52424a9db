"""The one transition, and the helpers every lifecycle service shares.

Callers hold the session row lock (`lock_session`) inside their own
`transaction.atomic()` block. `transition` is a compare-and-set UPDATE filtered
by the allowed source states, so the first terminal transition wins and any later
abort, error or end changes nothing and emits nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from sessions_app import signals, statements
from sessions_app.lifecycle import toolstate, usage
from sessions_app.lifecycle.usage import TOTAL_FIELDS
from sessions_app.models import (
    ACTIVE_STATES,
    STEER,
    STEER_FOLLOWUP,
    TERMINAL_STATES,
    Actor,
    ChatSession,
    Message,
    Run,
    RunState,
    RunSurface,
    SessionKind,
    SessionStatus,
)
from sessions_app.transitions import sources_for

# sessions.changed reasons (PROTOCOL.md §7) of a run's terminal state, and of an abort's stopReason
REASON_FOR_STATE = {
    RunState.DONE: "run.completed",
    RunState.FAILED: "run.failed",
    RunState.KILLED: "run.aborted",
    RunState.TIMEOUT: "run.timeout",
}
REASON_FOR_STOP = {"steer": "steer", "reset": "run.aborted", "delete": "run.aborted", "operator": "operator"}
# the row fields a run's outcome writes (see `take_outcome`)
OUTCOME_FIELDS = (
    "active_run",
    "status",
    "last_run",
    "ended_at",
    "aborted_last_run",
    "last_run_error",
    "waiting_for",
    "input_tokens",
    "output_tokens",
    # the session's usage totals (`lifecycle.usage`): written with the row, so never behind a lost update
    *TOTAL_FIELDS,
)


class LifecycleError(Exception):
    """A request the lifecycle cannot honour; `code` maps to a protocol error code."""

    def __init__(self, code: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


class SessionNotFound(LifecycleError):
    def __init__(self) -> None:
        super().__init__("NOT_FOUND", "session not found")


# --- finding and locking sessions -------------------------------------------------------


def _lock_by_key(owner_id: int | None, key: str | None) -> ChatSession | None:
    return statements.session("s.owner_id = %s AND s.key = %s", [owner_id, key], lock=True)


def lock_session(*, owner_id: int | None = None, key: str | None = None, pk: int | None = None) -> ChatSession:
    """The session, row-locked (with the runIds its row names): by owner and key (clients) or by
    primary key (operators)."""
    session = statements.session("s.id = %s", [pk], lock=True) if pk is not None else _lock_by_key(owner_id, key)
    if session is None:
        raise SessionNotFound()
    return session


def lock_run(run_pk: int) -> tuple[ChatSession, Run] | None:
    """A run and its session, the session row-locked first (and the run), in one statement; None
    when either is gone.

    Read under the lock, the run's state is current: every state change holds it.
    """
    return statements.locked_run(run_pk)


def lock_or_create_session(
    *, owner_id: int, key: str, agent_id: str, actor: str, kind: str = SessionKind.DIRECT
) -> ChatSession:
    """The locked session, created once (of `kind`) even when two creators race."""
    existing = _lock_by_key(owner_id, key)
    if existing is not None:
        return existing
    try:
        with transaction.atomic():  # savepoint: the unique constraint decides the race
            session = ChatSession.objects.create(owner_id=owner_id, key=key, agent_id=agent_id, kind=kind)
    except IntegrityError:
        return lock_session(owner_id=owner_id, key=key)
    session.active_run = session.last_run = None  # known: no query to find out
    row_changed(session, reason="create", actor=actor)
    return session


# --- the session row ------------------------------------------------------------------------


def save_row(session: ChatSession, *fields: str) -> None:
    """Persist changed row fields and bump `version` (one step per committed change)."""
    session.version += 1
    session.updated_at = timezone.now()
    statements.update(session, *fields, "version", "updated_at")


def row_changed(session: ChatSession, *, reason: str, actor: str, deleted: bool = False, detail: str = "") -> None:
    """Announce a session-level change (create, patch, reset, delete, operator repair, a branch moved);
    `detail` goes into its audit row."""
    signals.session_changed.send(
        sender=ChatSession, session=session, reason=reason, actor=actor, deleted=deleted, detail=detail
    )


def take_outcome(session: ChatSession, run: Run | None) -> None:
    """THE rule for a run's outcome on its session row: copy a terminal run's outcome onto the
    row, as its terminal transition would have; `None` clears it (a reset: no last run).

    Every writer of the outcome fields (terminal transitions, a send failed before its ack,
    reset, operator repairs) goes through here, so the row cannot say one thing per path.
    """
    session.waiting_for = ""  # nothing of an ended run waits for anyone
    if run is None:
        session.status = None
        session.last_run = None
        session.ended_at = None
        session.aborted_last_run = False
        session.last_run_error = ""
        session.input_tokens = session.output_tokens = None
        return
    session.status = run.state
    session.last_run = run
    session.ended_at = run.ended_at or timezone.now()
    session.aborted_last_run = run.state == RunState.KILLED
    session.last_run_error = run.error_message if run.state in (RunState.FAILED, RunState.TIMEOUT) else ""
    # the row's token counts are its last run's, as stored (None when it reported none)
    session.input_tokens, session.output_tokens = run.prompt_tokens, run.completion_tokens


def dispatch_stamp(owner_process: str) -> dict[str, Any]:
    """What a run entering `dispatching` is stamped with: its dispatch time and its owner."""
    return _stamped(RunState.DISPATCHING, {}, owner_process=owner_process)


def start_inserted(run: Run, session: ChatSession, *, reason: str, actor: str) -> None:
    """A new run inserted `dispatching` (`dispatch_stamp`, `stream_seq` 1) into the free slot of its
    locked session: what `transition` does for a queued run it starts, without the compare-and-set
    (nothing else can have seen the row). Its audit row and events say queued -> dispatching."""
    _activate(session, run)
    emit_run(
        run,
        session,
        from_state=RunState.QUEUED,
        to_state=RunState.DISPATCHING,
        reason=reason,
        actor=actor,
        row_changed=True,
    )


def _activate(session: ChatSession, run: Run) -> None:
    """Make `run` the session's active run and the row `running`; record the user's message at the end of
    its branch, which becomes the active one (`append_message`; a regenerated reply's run answers its
    `prompt` again: that message becomes the active leaf, and no user message is added)."""
    session.active_run = run
    session.last_run = run
    session.status = SessionStatus.RUNNING
    session.started_at = run.dispatched_at
    session.ended_at = None
    session.aborted_last_run = False
    session.last_run_error = ""
    session.waiting_for = ""
    if run.session_generation == session.session_id:
        if run.prompt_id is not None:
            session.active_leaf_id = run.prompt_id
        else:
            message = Message(session=session, session_generation=session.session_id, role="user", text=run.message)
            message.run = run
            append_message(session, message, after=run.follows_id)
    save_row(session, "started_at", "active_leaf", *OUTCOME_FIELDS)


def append_message(session: ChatSession, message: Message, *, after: int | None = None) -> Message:
    """THE way a message joins a transcript: inserted after the session's active leaf (or after `after`),
    and made the active leaf. The caller holds the session lock and saves the row (`active_leaf`)."""
    message.parent_id = session.active_leaf_id if after is None else after
    statements.insert(message)
    session.active_leaf_id = message.pk
    return message


# --- runs -------------------------------------------------------------------------------------


def next_queue_seq(session: ChatSession) -> int:
    return statements.next_queue_seq(session.pk)


def queued_runs(session: ChatSession) -> list[Run]:
    """The session's queue, oldest first (`statements` owns what a queue is)."""
    return statements.queued_runs(session.pk)


def emit_run(
    run: Run, session: ChatSession, *, from_state: str, to_state: str, reason: str, actor: str, row_changed: bool
) -> None:
    """Announce a run transition; it carries a `chat` event at `run.stream_seq` (already taken)."""
    signals.run_transitioned.send(
        sender=Run,
        run=run,
        session=session,
        from_state=from_state,
        to_state=to_state,
        reason=reason,
        actor=actor,
        row_changed=row_changed,
    )


@dataclass(frozen=True)
class Reply:
    """Reply text (the whole reply so far) a transition stores and announces as a delta of its own."""

    text: str
    # Called in the transaction with the delta's seq, to send it after commit, in order with the
    # transition's events; None: the caller sends it once the service returns (with that seq).
    announce: Callable[[int], None] | None = None


def transition(
    run: Run,
    to_state: str,
    *,
    session: ChatSession,
    reason: str,
    actor: str,
    owner_process: str,
    start_next: bool = True,
    via: str | None = None,
    text: Reply | None = None,
    **values: Any,
) -> bool:
    """Compare-and-set `run` into `to_state`; return False when another transition won.

    The caller holds the session lock. A run entering `dispatching` (here, or the
    queued successor started when an active run ends) is owned by `owner_process`:
    the process that executes it, or '' to leave it for any live server to claim.
    Terminal transitions update the row only for the active run of the current
    generation (§8).

    `via`: a state the run passes through on its way (`running`, for a run whose stream began
    before that was written), a step of its own in the events and the audit trail, written in the
    same compare-and-set. `text`: reply text stored with it, announced as a delta after the run started
    running and before it ended. Each event takes its own seq, in that order.
    """
    from_state = run.state
    path = [from_state, *([via] if via is not None else []), to_state]
    if any(src not in sources_for(dst) for src, dst in itertools.pairwise(path)):
        return False
    terminal = to_state in TERMINAL_STATES
    updates = _stamped(to_state, values, owner_process=owner_process)
    if via is not None:
        updates = {**_stamped(via, {}, owner_process=owner_process), **updates}
    if text is not None:
        updates["reply"] = text.text
        if run.surface == RunSurface.HTTP:  # the delta's boundary, as `record_delta` keeps it
            updates["marks"] = [*run.marks, len(text.text)]
    if terminal and run.tool_calls:
        # its open calls and approvals end with it, their events before its own (TOOLS.md §13.2)
        toolstate.close_open(
            run, session, to_state=to_state, stop_reason=str(values.get("stop_reason", "")), actor=actor
        )
    before = (run.ended_at, run.completion_tokens)  # as the run stood in the steps before its end
    events = len(path) - 1 + (text is not None)
    with statements.inserts_together():  # the audit rows of every step, and of the next run's start
        if not _compare_and_set(run, to_state, updates, events=events):
            if terminal and run.tool_calls:
                # Cannot happen under the session lock; if it did, the calls closed above must not stand.
                raise RuntimeError(f"run {run.pk} changed under its session lock")
            return False
        if from_state == RunState.QUEUED:
            _left_queue(session, run)
        seq = run.stream_seq - events + 1
        if via is not None:
            _announce_step(run, session, from_state, via, seq, before, actor=actor)
            from_state, seq = via, seq + 1
        if not terminal:
            activated = to_state == RunState.DISPATCHING
            if activated:
                _activate(session, run)
            _announce_step(
                run, session, from_state, to_state, seq, before, reason=reason, actor=actor, changed=activated
            )
            seq += 1
        if text is not None and text.announce is not None:
            text.announce(seq)
        if not terminal:
            return True
        kept = _keep_reply(session, run, from_state, to_state)
        if run.budget is not None:
            usage.release(run)  # what it still holds of its reservation, back to its budgets
        was_active, changed = _release_row(session, run, from_state)
        if kept and not changed:  # (cannot happen: a reply is kept only of the current active run)
            statements.update(session, "active_leaf")
        emit_run(
            run, session, from_state=from_state, to_state=to_state, reason=reason, actor=actor, row_changed=changed
        )
        if was_active:
            steers_to_followups(session, actor=actor)
        if was_active and start_next:
            start_next_queued(session, actor=Actor.SYSTEM, owner_process=owner_process)
    return True


# the reason of the `running` step a run takes on its way to a later state (`transition`'s `via`)
REASON_FOR_STEP: dict[str, str] = {RunState.RUNNING: "run.running"}


def _announce_step(
    run: Run,
    session: ChatSession,
    from_state: str,
    to_state: str,
    seq: int,
    before: tuple[Any, Any],
    *,
    actor: str,
    reason: str | None = None,
    changed: bool = False,
) -> None:
    """Announce a non-terminal step of a transition at its own seq, the run as it stood then."""
    after = (run.state, run.stream_seq, run.ended_at, run.completion_tokens)
    run.state, run.stream_seq = to_state, seq
    run.ended_at, run.completion_tokens = before
    try:
        emit_run(
            run,
            session,
            from_state=from_state,
            to_state=to_state,
            reason=reason or REASON_FOR_STEP[to_state],
            actor=Actor.SYSTEM if reason is None else actor,
            row_changed=changed,
        )
    finally:
        run.state, run.stream_seq, run.ended_at, run.completion_tokens = after


def _left_queue(session: ChatSession, run: Run) -> None:
    """The run left its session's queue: so does the queue known with the locked row (if any)."""
    queue = statements.known_queue(session)
    if queue is None:
        return
    if run.run_id in queue:
        queue.remove(run.run_id)
    else:  # not what was read: read it again when it is needed
        statements.forget_queue(session)


def _stamped(to_state: str, values: dict[str, Any], *, owner_process: str) -> dict[str, Any]:
    """The fields a transition into `to_state` writes besides the state: the caller's, and its time stamp
    (and, entering `dispatching`, its owner)."""
    now = timezone.now()
    updates: dict[str, Any] = dict(values)
    if to_state in TERMINAL_STATES:
        updates["ended_at"] = now
    elif to_state == RunState.RUNNING:
        updates["started_at"] = now
    elif to_state == RunState.DISPATCHING:
        updates["dispatched_at"] = now
        updates["owner_process"] = owner_process
    return updates


def _release_row(session: ChatSession, run: Run, from_state: str) -> tuple[bool, bool]:
    """The session row after `run` ended: free its slot if it was the active run, and take its outcome
    when it is of the current generation. Returns (was the active run, the row changed)."""
    was_active = from_state in ACTIVE_STATES and session.active_run_id == run.pk
    current_generation = run.session_generation == session.session_id
    if was_active:
        session.active_run = None
        if current_generation:
            take_outcome(session, run)
            save_row(session, "active_leaf", *OUTCOME_FIELDS)
        else:
            # An old-generation run never touches the row (§8); only release the slot.
            statements.update(session, "active_run")
        return True, current_generation
    if from_state == RunState.QUEUED and current_generation:
        save_row(session)  # queuedRunIds changed
        return False, True
    return False, False


def _keep_reply(session: ChatSession, run: Run, from_state: str, to_state: str) -> bool:
    """The reply of a run that had started joins the transcript of the current generation at the end of
    the active branch (its user message, or the prompt it answers again); partial text of an aborted,
    failed or timed-out run is kept, marked. Whether it was (the row's `active_leaf` is then to save)."""
    if (
        run.session_generation == session.session_id
        and from_state in ACTIVE_STATES
        and (to_state == RunState.DONE or run.reply or run.tool_calls)
    ):
        reply_part(session, run, run.reply, last_step=0, aborted=to_state != RunState.DONE)
        return True
    return False


def reply_part(session: ChatSession, run: Run, text: str, *, last_step: int, aborted: bool = False) -> Message:
    """THE rule of a run's reply in the transcript: one assistant message, or, for a run that took
    steering messages (`lifecycle.steering`), one part before each of them and one at its end. A part
    holds the reply's text after the part before (`text` is the whole reply so far) and the calls of
    the steps after it, up to `last_step` (0: all the rest). Only a run that took steers (`Run.steers`)
    reads its earlier parts. Each part joins the active branch (`append_message`)."""
    start, first_step = 0, 1
    before = Message.objects.filter(run=run, role="assistant").order_by("-id").first() if run.steers else None
    if before is not None:
        start, first_step = before.reply_start + len(before.text), before.last_step + 1
        if text[start:].startswith("\n\n"):  # the paragraph break before a later step's text
            start += 2
    part = Message(
        session=session,
        session_generation=session.session_id,
        role="assistant",
        text=text[start:],
        aborted=aborted,
        reply_start=start,
        first_step=first_step,
        last_step=last_step,
    )
    part.run = run
    return append_message(session, part)


def _compare_and_set(run: Run, to_state: str, updates: dict[str, Any], *, events: int = 1) -> bool:
    """One statement: move `run` from its state to `to_state`, take the next `events` event seqs,
    read back the stored text (deltas write it without the session lock); False if the state had moved."""
    values = {"state": to_state, **updates}
    fields = [Run._meta.get_field(name) for name in values]
    quote = connection.ops.quote_name
    sets = ", ".join(f"{quote(str(f.column))} = %s" for f in fields)  # type: ignore[union-attr]
    sql = (
        f"UPDATE {quote(Run._meta.db_table)} SET {sets}, stream_seq = stream_seq + %s "
        "WHERE id = %s AND state = %s RETURNING stream_seq, reply"
    )
    params = [f.get_db_prep_save(values[f.name], connection) for f in fields]  # type: ignore[union-attr]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, events, run.pk, run.state])
        row = cursor.fetchone()
    if row is None:
        return False
    for name, value in values.items():
        setattr(run, name, value)
    run.stream_seq, run.reply = int(row[0]), row[1]
    return True


def steers_to_followups(session: ChatSession, *, actor: str) -> None:
    """The active run of the session ended: the steers it did not take become queued follow-ups, each
    announced (its `chat` status event says `steer: followup`), never dropped (`lifecycle.steering`)."""
    if statements.known_queue(session) == []:
        return
    for run in queued_runs(session):
        if run.queue_mode != STEER:
            continue
        updated = _set_queue_mode(run, STEER_FOLLOWUP)
        if updated:
            emit_run(
                run,
                session,
                from_state=RunState.QUEUED,
                to_state=RunState.QUEUED,
                reason="steer.followup",
                actor=actor,
                row_changed=False,
            )


def _set_queue_mode(run: Run, queue_mode: str) -> bool:
    """Compare-and-set a queued run's queue mode, taking its next event seq; False when it left the queue."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Run._meta.db_table} SET queue_mode = %s, stream_seq = stream_seq + 1 "
            "WHERE id = %s AND state = %s AND queue_mode = %s RETURNING stream_seq",
            [queue_mode, run.pk, RunState.QUEUED, run.queue_mode],
        )
        row = cursor.fetchone()
    if row is None:
        return False
    run.queue_mode, run.stream_seq = queue_mode, int(row[0])
    return True


def start_next_queued(session: ChatSession, *, actor: str, owner_process: str) -> Run | None:
    """Hand the free slot to the session's oldest queued run, if any."""
    if session.active_run_id is not None or statements.known_queue(session) == []:
        return None
    for run in queued_runs(session):
        if transition(
            run, RunState.DISPATCHING, session=session, reason="run.started", actor=actor, owner_process=owner_process
        ):
            return run
    return None


def kill(run: Run, session: ChatSession, *, stop_reason: str, actor: str, owner_process: str, start_next: bool) -> bool:
    """Abort one run (stopReason `stop_reason`)."""
    return transition(
        run,
        RunState.KILLED,
        session=session,
        reason=REASON_FOR_STOP.get(stop_reason, "run.aborted"),
        actor=actor,
        owner_process=owner_process,
        start_next=start_next,
        stop_reason=stop_reason,
    )


def kill_all(session: ChatSession, *, stop_reason: str, actor: str) -> list[str]:
    """Abort the queued runs (newest first, so none is started) then the active one."""
    killed: list[str] = []
    for run in reversed(queued_runs(session)):
        if kill(run, session, stop_reason=stop_reason, actor=actor, owner_process="", start_next=False):
            killed.append(run.run_id)
    if session.active_run_id is not None:
        active = Run.objects.get(pk=session.active_run_id)
        if kill(active, session, stop_reason=stop_reason, actor=actor, owner_process="", start_next=False):
            killed.append(active.run_id)
    killed.reverse()
    return killed
