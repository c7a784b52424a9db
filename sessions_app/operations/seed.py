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
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.color import no_style
from django.db import connection, models, transaction
from django.db.models import Max
from django.utils import timezone

from sessions_app.models import ChatSession, LifecycleEvent, Message, Run, RunState, SessionStatus

DEAD_PROCESS = "seed-dead-process"
TERMINAL_WEIGHTS = [(RunState.DONE, 85), (RunState.FAILED, 6), (RunState.KILLED, 5), (RunState.TIMEOUT, 4)]
ERROR_KIND = {RunState.FAILED: "backend", RunState.TIMEOUT: "timeout"}
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
    result = SeedResult(users=len(owner_ids))
    session_ins = _Inserter(ChatSession, SESSION_COLUMNS)
    run_ins = _Inserter(Run, RUN_COLUMNS)
    msg_ins = _Inserter(Message, MESSAGE_COLUMNS)
    audit_ins = _Inserter(LifecycleEvent, AUDIT_COLUMNS)
    per_session, extra = divmod(runs, sessions) if sessions else (0, 0)
    states, weights = zip(*TERMINAL_WEIGHTS, strict=True)
    body_hash = hashlib.sha256(b"seed").hexdigest()
    # Stuck sessions are spread over the whole range instead of bunched at the start.
    stuck_every = sessions // stuck if stuck else 0

    session_pk = _next_id(ChatSession)
    run_pk = _next_id(Run)
    written = 0
    while written < sessions:
        chunk = min(batch_size, sessions - written)
        s_rows: list[dict[str, Any]] = []
        r_rows: list[dict[str, Any]] = []
        m_rows: list[dict[str, Any]] = []
        a_rows: list[dict[str, Any]] = []
        for i in range(written, written + chunk):
            n_runs = per_session + (1 if i < extra else 0)
            owner = owner_ids[i % len(owner_ids)]
            generation = uuid.uuid4()
            created = now - timedelta(days=rng.uniform(0, 90))
            is_stuck = bool(stuck_every) and n_runs > 0 and i % stuck_every == 0 and result.stuck < stuck
            # Each session is used for up to 30 days after its creation, so last activity
            # (and with it retention age) spreads over the whole range.
            active_until = min(now, created + timedelta(days=rng.uniform(0, 30)))
            span = (active_until - created).total_seconds()
            times = sorted(rng.uniform(0, span) for _ in range(n_runs))
            last: dict[str, Any] | None = None
            for j, offset in enumerate(times):
                started = created + timedelta(seconds=offset)
                is_last = j == n_runs - 1
                if is_last and is_stuck:
                    state = RunState.RUNNING
                    started = now - timedelta(minutes=rng.uniform(5, 120))
                else:
                    state = rng.choices(states, weights)[0]
                ended = None if state == RunState.RUNNING else started + timedelta(seconds=rng.uniform(0.5, 60))
                reply = "" if state in (RunState.FAILED, RunState.RUNNING) else f"echo: seeded message {j}"
                row = {
                    "id": run_pk,
                    "session": session_pk,
                    "run_id": f"seed-{tag}-{i}-{j}",
                    "session_generation": generation,
                    "state": state,
                    "queue_mode": "followup",
                    "queue_seq": j + 1,
                    "message": f"seeded message {j}",
                    "body_hash": body_hash,
                    "attachments": [],
                    "reply": reply,
                    "stream_seq": 3 if ended else 2,
                    "error_kind": ERROR_KIND.get(state, ""),
                    "error_message": "seeded backend failure"
                    if state == RunState.FAILED
                    else ("seeded timeout" if state == RunState.TIMEOUT else ""),
                    "stop_reason": STOP_REASON.get(state, ""),
                    "timeout_ms": 600_000,
                    "owner_process": DEAD_PROCESS if state == RunState.RUNNING else f"seed-{tag}",
                    "created_by": owner,
                    "created_at": started,
                    "dispatched_at": started,
                    "started_at": started,
                    "ended_at": ended,
                }
                r_rows.append(row)
                if transcripts:
                    m_rows.append(
                        {
                            "session": session_pk,
                            "session_generation": generation,
                            "role": "user",
                            "text": row["message"],
                            "run": run_pk,
                            "aborted": False,
                            "created_at": started,
                        }
                    )
                    if ended is not None and reply:
                        m_rows.append(
                            {
                                "session": session_pk,
                                "session_generation": generation,
                                "role": "assistant",
                                "text": reply,
                                "run": run_pk,
                                "aborted": state != RunState.DONE,
                                "created_at": ended,
                            }
                        )
                    a_rows.append(
                        {
                            "session": session_pk,
                            "run": run_pk,
                            "from_state": "running",
                            "to_state": state,
                            "reason": "seed",
                            "actor": "system",
                            "detail": row["error_message"],
                            "actor_user_id": None,
                            "actor_name": "",
                            "created_at": ended or started,
                        }
                    )
                last = row
                run_pk += 1
            if last is None:
                status, started_at, ended_at, error = None, None, None, ""
            else:
                status = SessionStatus.RUNNING if last["state"] == RunState.RUNNING else last["state"]
                started_at, ended_at = last["started_at"], last["ended_at"]
                error = last["error_message"] if last["state"] in (RunState.FAILED, RunState.TIMEOUT) else ""
            if is_stuck:
                result.stuck += 1
            s_rows.append(
                {
                    "id": session_pk,
                    "owner": owner,
                    "key": f"agent:main:seed-{tag}-{i}",
                    "agent_id": "main",
                    "session_id": generation,
                    "label": f"Seeded session {i}",
                    "status": status,
                    "active_run": last["id"] if is_stuck and last else None,
                    "last_run": last["id"] if last else None,
                    "started_at": started_at,
                    "ended_at": ended_at,
                    "aborted_last_run": bool(last and last["state"] == RunState.KILLED),
                    "last_run_error": error,
                    "version": 1 + 3 * n_runs,
                    "created_at": created,
                    "updated_at": (ended_at or started_at or created),
                }
            )
            session_pk += 1
        # Sessions and runs point at each other; the foreign keys are checked at commit.
        with transaction.atomic():
            result.sessions += session_ins.insert(s_rows)
            result.runs += run_ins.insert(r_rows)
            result.messages += msg_ins.insert(m_rows)
            result.audit += audit_ins.insert(a_rows)
        written += chunk
        if progress is not None:
            progress(chunk)
    _reset_sequences()
    return result
