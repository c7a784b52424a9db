"""Demo and benchmark data: many sessions and runs, inserted in bulk.

Rows are written with `executemany` rather than `bulk_create` because the demo
needs realistic ages (`created_at`/`updated_at` in the past), and `auto_now` /
`auto_now_add` fields overwrite any value given to `bulk_create`. The data keeps
the lifecycle invariants (§8) except for the `stuck` sessions, which are
deliberately left running under a process that never heartbeats, so the admin's
"stuck" filter, the recovery sweep and `gateway_doctor` have something to find.
"""

from __future__ import annotations

import hashlib
import random
import secrets
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.color import no_style
from django.db import connection, models, transaction
from django.db.models import Max
from django.utils import timezone

from sessions_app import branches
from sessions_app.models import ChatSession, LifecycleEvent, Message, Run, RunErrorKind, RunState, SessionStatus

DEAD_PROCESS = "seed-dead-process"
TERMINAL_WEIGHTS = [(RunState.DONE, 85), (RunState.FAILED, 6), (RunState.KILLED, 5), (RunState.TIMEOUT, 4)]
ERROR_KIND = {RunState.FAILED: RunErrorKind.BACKEND, RunState.TIMEOUT: RunErrorKind.TIMEOUT}
ERROR_MESSAGE = {RunState.FAILED: "seeded backend failure", RunState.TIMEOUT: "seeded timeout"}
STOP_REASON = {RunState.KILLED: "rpc", RunState.TIMEOUT: "timeout", RunState.DONE: "stop"}


@dataclass
class SeedResult:
    users: int = 0
    sessions: int = 0
    runs: int = 0
    messages: int = 0
    audit: int = 0
    stuck: int = 0


class _Inserter:
    """`executemany` INSERTs of plain dicts, values prepared per field type once."""

    def __init__(self, model: type[models.Model], columns: Sequence[str]) -> None:
        fields = [model._meta.get_field(name) for name in columns]
        self.names = list(columns)
        table = connection.ops.quote_name(model._meta.db_table)
        cols = ", ".join(connection.ops.quote_name(f.column) for f in fields)  # type: ignore[union-attr,arg-type]
        marks = ", ".join(["%s"] * len(fields))
        self.sql = f"INSERT INTO {table} ({cols}) VALUES ({marks})"
        # Only these field types need converting; everything else goes through as is.
        # Datetimes are always aware here, so the backend adapter is enough (and 3x faster).
        self.preps: list[Callable[[Any], Any] | None] = []
        for f in fields:
            if isinstance(f, models.DateTimeField):
                self.preps.append(connection.ops.adapt_datetimefield_value)
            elif isinstance(f, models.UUIDField | models.JSONField):
                self.preps.append(_db_prep_save(f))
            else:
                self.preps.append(None)

    def insert(self, rows: Iterable[dict[str, Any]]) -> int:
        params = []
        for row in rows:
            params.append(
                [
                    row[n] if prep is None or row[n] is None else prep(row[n])
                    for n, prep in zip(self.names, self.preps, strict=True)
                ]
            )
        if params:
            with connection.cursor() as cursor:
                cursor.executemany(self.sql, params)
        return len(params)


def _db_prep_save(field: Any) -> Callable[[Any], Any]:
    def prep(value: Any) -> Any:
        return field.get_db_prep_save(value, connection)

    return prep


SESSION_COLUMNS = (
    "id",
    "owner",
    "key",
    "agent_id",
    "session_id",
    "label",
    "status",
    "active_run",
    "last_run",
    "started_at",
    "ended_at",
    "aborted_last_run",
    "last_run_error",
    "version",
    "created_at",
    "updated_at",
)
RUN_COLUMNS = (
    "id",
    "session",
    "run_id",
    "session_generation",
    "state",
    "queue_mode",
    "queue_seq",
    "message",
    "body_hash",
    "attachments",
    "reply",
    "stream_seq",
    "error_kind",
    "error_message",
    "stop_reason",
    "timeout_ms",
    "owner_process",
    "created_by",
    "created_at",
    "dispatched_at",
    "started_at",
    "ended_at",
)
MESSAGE_COLUMNS = ("session", "session_generation", "role", "text", "run", "aborted", "created_at")
AUDIT_COLUMNS = (
    "session",
    "run",
    "from_state",
    "to_state",
    "reason",
    "actor",
    "detail",
    "actor_user_id",
    "actor_name",
    "created_at",
)


def _ensure_users(count: int) -> list[int]:
    User = get_user_model()
    names = [f"seed-user-{i}" for i in range(count)]
    existing = set(User.objects.filter(username__in=names).values_list("username", flat=True))
    missing = [User(username=n, is_active=True) for n in names if n not in existing]
    for user in missing:
        user.set_unusable_password()
    User.objects.bulk_create(missing)
    return list(User.objects.filter(username__in=names).order_by("pk").values_list("pk", flat=True))


def _next_id(model: type[models.Model]) -> int:
    return int(model._default_manager.aggregate(m=Max("pk"))["m"] or 0) + 1


def _reset_sequences() -> None:
    """PostgreSQL keeps a sequence per table; explicit ids leave it behind."""
    statements = connection.ops.sequence_reset_sql(no_style(), [ChatSession, Run])
    if statements:
        with connection.cursor() as cursor:
            for sql in statements:
                cursor.execute(sql)


@dataclass
class _Plan:
    """What every session of one seeding shares."""

    rng: random.Random
    tag: str
    now: datetime
    owner_ids: list[int]
    per_session: int  # runs of each session, and one more for the first `extra`
    extra: int
    stuck: int
    stuck_every: int  # stuck sessions are spread over the whole range instead of bunched at the start
    transcripts: bool
    body_hash: str = hashlib.sha256(b"seed").hexdigest()


@dataclass
class _Batch:
    """The rows of one transaction."""

    sessions: list[dict[str, Any]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    audit: list[dict[str, Any]] = field(default_factory=list)


def seed_demo_data(
    *,
    sessions: int,
    runs: int,
    users: int = 20,
    stuck: int | None = None,
    transcripts: bool = False,
    batch_size: int = 1000,
    rng_seed: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> SeedResult:
    """Insert `sessions` sessions holding `runs` runs in total, `batch_size` sessions per transaction.

    `stuck` sessions (default: one per thousand, at least one when there are runs) end
    with an active run owned by a process that never heartbeats. `transcripts` adds the
    user and assistant messages and one audit row per run. `progress(n)` is called
    with the number of sessions written after each batch.
    """
    if sessions < 0 or runs < 0 or users < 1:
        raise ValueError("sessions and runs must be >= 0, users >= 1")
    rng = random.Random(rng_seed)
    tag = secrets.token_hex(3)
    now = timezone.now()
    owner_ids = _ensure_users(users)
    if stuck is None:
        stuck = max(1, sessions // 1000) if runs and sessions else 0
    stuck = min(stuck, sessions, runs)
    per_session, extra = divmod(runs, sessions) if sessions else (0, 0)
    plan = _Plan(
        rng=rng,
        tag=tag,
        now=now,
        owner_ids=owner_ids,
        per_session=per_session,
        extra=extra,
        stuck=stuck,
        stuck_every=sessions // stuck if stuck else 0,
        transcripts=transcripts,
    )
    result = SeedResult(users=len(owner_ids))
    inserters = [
        _Inserter(ChatSession, SESSION_COLUMNS),
        _Inserter(Run, RUN_COLUMNS),
        _Inserter(Message, MESSAGE_COLUMNS),
        _Inserter(LifecycleEvent, AUDIT_COLUMNS),
    ]
    session_pk = _next_id(ChatSession)
    run_pk = _next_id(Run)
    written = 0
    while written < sessions:
        chunk = min(batch_size, sessions - written)
        batch = _Batch()
        for i in range(written, written + chunk):
            run_pk = _add_session(batch, plan, result, i, session_pk, run_pk)
            session_pk += 1
        _write(batch, inserters, result)
        written += chunk
        if progress is not None:
            progress(chunk)
    _reset_sequences()
    return result


def _write(batch: _Batch, inserters: list[_Inserter], result: SeedResult) -> None:
    # Sessions and runs point at each other; the foreign keys are checked at commit.
    sessions, runs, messages, audit = inserters
    with transaction.atomic():
        result.sessions += sessions.insert(batch.sessions)
        result.runs += runs.insert(batch.runs)
        result.messages += messages.insert(batch.messages)
        result.audit += audit.insert(batch.audit)
        if batch.messages:  # each transcript one branch (messages are inserted without parents)
            branches.link_as_one_branch(sorted({m["session"] for m in batch.messages}))


def _add_session(batch: _Batch, plan: _Plan, result: SeedResult, i: int, session_pk: int, run_pk: int) -> int:
    """Session number `i` with its runs (and transcript) into `batch`; returns the next run pk."""
    rng = plan.rng
    n_runs = plan.per_session + (1 if i < plan.extra else 0)
    owner = plan.owner_ids[i % len(plan.owner_ids)]
    generation = uuid.uuid4()
    created = plan.now - timedelta(days=rng.uniform(0, 90))
    is_stuck = bool(plan.stuck_every) and n_runs > 0 and i % plan.stuck_every == 0 and result.stuck < plan.stuck
    # Each session is used for up to 30 days after its creation, so last activity
    # (and with it retention age) spreads over the whole range.
    active_until = min(plan.now, created + timedelta(days=rng.uniform(0, 30)))
    span = (active_until - created).total_seconds()
    times = sorted(rng.uniform(0, span) for _ in range(n_runs))
    last: dict[str, Any] | None = None
    for j, offset in enumerate(times):
        started = created + timedelta(seconds=offset)
        last = _run_row(plan, run_pk, session_pk, generation, owner, i, j, started, j == n_runs - 1 and is_stuck)
        batch.runs.append(last)
        if plan.transcripts:
            _add_transcript(batch, last)
        run_pk += 1
    if is_stuck:
        result.stuck += 1
    batch.sessions.append(_session_row(plan, session_pk, owner, generation, i, n_runs, created, last, is_stuck))
    return run_pk


def _run_row(
    plan: _Plan,
    run_pk: int,
    session_pk: int,
    generation: uuid.UUID,
    owner: int,
    i: int,
    j: int,
    started: datetime,
    stuck: bool,
) -> dict[str, Any]:
    """Run `j` of session `i`: ended in a weighted terminal state, or left running (a stuck session's last)."""
    rng = plan.rng
    if stuck:
        state = RunState.RUNNING
        started = plan.now - timedelta(minutes=rng.uniform(5, 120))
    else:
        states, weights = zip(*TERMINAL_WEIGHTS, strict=True)
        state = rng.choices(states, weights)[0]
    ended = None if state == RunState.RUNNING else started + timedelta(seconds=rng.uniform(0.5, 60))
    return {
        "id": run_pk,
        "session": session_pk,
        "run_id": f"seed-{plan.tag}-{i}-{j}",
        "session_generation": generation,
        "state": state,
        "queue_mode": "followup",
        "queue_seq": j + 1,
        "message": f"seeded message {j}",
        "body_hash": plan.body_hash,
        "attachments": [],
        "reply": "" if state in (RunState.FAILED, RunState.RUNNING) else f"echo: seeded message {j}",
        "stream_seq": 3 if ended else 2,
        "error_kind": ERROR_KIND.get(state, ""),
        "error_message": ERROR_MESSAGE.get(state, ""),
        "stop_reason": STOP_REASON.get(state, ""),
        "timeout_ms": 600_000,
        "owner_process": DEAD_PROCESS if state == RunState.RUNNING else f"seed-{plan.tag}",
        "created_by": owner,
        "created_at": started,
        "dispatched_at": started,
        "started_at": started,
        "ended_at": ended,
    }


def _add_transcript(batch: _Batch, run: dict[str, Any]) -> None:
    """The run's user message, its reply (when it ended with one) and its terminal audit row."""
    common = {"session": run["session"], "session_generation": run["session_generation"], "run": run["id"]}
    started, ended, reply = run["started_at"], run["ended_at"], run["reply"]
    batch.messages.append({**common, "role": "user", "text": run["message"], "aborted": False, "created_at": started})
    if ended is not None and reply:
        aborted = run["state"] != RunState.DONE
        batch.messages.append({**common, "role": "assistant", "text": reply, "aborted": aborted, "created_at": ended})
    batch.audit.append(
        {
            "session": run["session"],
            "run": run["id"],
            "from_state": "running",
            "to_state": run["state"],
            "reason": "seed",
            "actor": "system",
            "detail": run["error_message"],
            "actor_user_id": None,
            "actor_name": "",
            "created_at": ended or started,
        }
    )


def _session_row(
    plan: _Plan,
    session_pk: int,
    owner: int,
    generation: uuid.UUID,
    i: int,
    n_runs: int,
    created: datetime,
    last: dict[str, Any] | None,
    stuck: bool,
) -> dict[str, Any]:
    """Session `i` as its last run left it (still running, for a stuck one)."""
    if last is None:
        status, started_at, ended_at, error = None, None, None, ""
    else:
        status = SessionStatus.RUNNING if last["state"] == RunState.RUNNING else last["state"]
        started_at, ended_at = last["started_at"], last["ended_at"]
        error = last["error_message"] if last["state"] in (RunState.FAILED, RunState.TIMEOUT) else ""
    return {
        "id": session_pk,
        "owner": owner,
        "key": f"agent:main:seed-{plan.tag}-{i}",
        "agent_id": "main",
        "session_id": generation,
        "label": f"Seeded session {i}",
        "status": status,
        "active_run": last["id"] if stuck and last else None,
        "last_run": last["id"] if last else None,
        "started_at": started_at,
        "ended_at": ended_at,
        "aborted_last_run": bool(last and last["state"] == RunState.KILLED),
        "last_run_error": error,
        "version": 1 + 3 * n_runs,
        "created_at": created,
        "updated_at": (ended_at or started_at or created),
    }
