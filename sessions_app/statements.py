"""The few reads of the hot path, as SQL compiled once instead of on every call.

Every turn reads a session (locked, with the runIds its row names) and a run a few
times. Building those statements with the ORM costs more than running them, so they
are composed once per process from the models' metadata and executed directly; the
rows become model instances through the fields' own database converters, exactly as
the ORM would make them. Everything else goes through the ORM.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import defaultdict
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from typing import Any, NamedTuple, TypeVar

from django.db import connection, models
from django.db.models import DEFERRED, Field, Model

from sessions_app.models import ChatSession, Run, RunState

M = TypeVar("M", bound=Model)
# attribute names of the runIds a session row names (see `run_id_of`)
ACTIVE_RUN_ID = "_active_run_rid"
LAST_RUN_ID = "_last_run_rid"
# attribute name of a session's queue as read with its row (see `known_queue`)
QUEUED_IDS = "_queued_rids"


class _Shape:
    """The columns of one model (all, or only some) in a SELECT, and how to turn them back into an
    instance; the fields not read are deferred, as the ORM's `only()` leaves them."""

    def __init__(self, model: type[Model], alias: str, only: Collection[str] | None = None) -> None:
        self.model = model
        concrete: list[Field[Any, Any]] = list(model._meta.concrete_fields)  # type: ignore[arg-type]
        self.fields = [f for f in concrete if only is None or f.attname in only]
        self.names = [f.attname for f in concrete]
        # where each column read goes among the model's fields (None: all, in order)
        self.slots = None if len(self.fields) == len(concrete) else [concrete.index(f) for f in self.fields]
        quote = connection.ops.quote_name
        self.columns = ", ".join(f"{alias}.{quote(str(f.column))}" for f in self.fields)
        # as the ORM's compiler does: the backend's converters, then the field's; kept only for the
        # fields that have any (most columns come back from the driver as they are)
        self.converters: list[tuple[int, Any, list[Any]]] = []
        for f in self.fields:
            col = f.get_col(alias)
            converters = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
            if converters:
                self.converters.append((concrete.index(f), col, converters))

    def make(self, values: Sequence[Any]) -> Model:
        if self.slots is None:
            row = list(values)
        else:
            row = [DEFERRED] * len(self.names)
            for slot, value in zip(self.slots, values, strict=True):
                row[slot] = value
        for slot, col, converters in self.converters:
            value = row[slot]
            for convert in converters:
                value = convert(value, col, connection)
            row[slot] = value
        return self.model.from_db(connection.alias, self.names, row)


@cache
def _shapes(vendor: str) -> tuple[_Shape, _Shape]:
    return _Shape(ChatSession, "s"), _Shape(Run, "r")


def _table(model: type[Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def _extra_list(vendor: str) -> list[str]:
    """What a session is read with, after its columns (alias `s`): the runIds its row names, its
    `version` as of the statement's snapshot, and its queue (`_queue_sql`)."""
    runs = _table(Run)
    # Under a row lock PostgreSQL re-reads the locked row once its holder commits, but the
    # subqueries keep the statement's snapshot: a `version` read there that differs from the row's
    # says they may be older than the row (see `_known`). (SQLite's snapshot is the row's.)
    version = (
        "s.version" if vendor == "sqlite" else f"(SELECT v.version FROM {_table(ChatSession)} v WHERE v.id = s.id)"
    )
    return [
        f"(SELECT a.run_id FROM {runs} a WHERE a.id = s.active_run_id)",
        f"(SELECT l.run_id FROM {runs} l WHERE l.id = s.last_run_id)",
        version,
        _queue_sql(vendor),
    ]


def _extras(vendor: str) -> str:
    return ", ".join(_extra_list(vendor))


EXTRAS = 4  # columns `_extras` adds


@cache
def _session_sql(where: str, lock: bool, vendor: str) -> str:
    session, _run = _shapes(vendor)
    # FOR UPDATE only where the database has it (SQLite's IMMEDIATE transactions serialise writers)
    lock_clause = " FOR UPDATE OF s" if lock and connection.features.has_select_for_update_of else ""
    return f"SELECT {session.columns}, {_extras(vendor)} FROM {_table(ChatSession)} s WHERE {where}{lock_clause}"


def _known(found: ChatSession, extras: Sequence[Any]) -> ChatSession:
    """A session as read, with what was read with it (`_extras`): the runIds its row names, and its
    queue when it was read from the same state as the row."""
    setattr(found, ACTIVE_RUN_ID, extras[0])
    setattr(found, LAST_RUN_ID, extras[1])
    if extras[2] == found.version:
        setattr(found, QUEUED_IDS, _queue_of(extras[3]))
    return found


def lock_name(name: str) -> None:
    """Serialise the transactions that take this name until each ends, where no row exists yet to
    lock: PostgreSQL's advisory transaction lock (SQLite's IMMEDIATE transactions already serialise
    every writer)."""
    if connection.vendor == "postgresql":
        lock = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [lock])


def session(where: str, params: Sequence[Any], *, lock: bool = False) -> ChatSession | None:
    """One session with the runIds its row names and its queue, in one statement (`where` uses alias `s`)."""
    with connection.cursor() as cursor:
        cursor.execute(_session_sql(where, lock, connection.vendor), params)
        row = cursor.fetchone()
    if row is None:
        return None
    shape = _shapes(connection.vendor)[0]
    found = shape.make(row[:-EXTRAS])
    assert isinstance(found, ChatSession)
    return _known(found, row[-EXTRAS:])


@cache
def _locked_run_sql(vendor: str) -> str:
    session, run = _shapes(vendor)
    # The session first, then the run: every transition takes them in that order. Locked too, the
    # run is read as its last writer committed it (a row only referenced would be read as of the
    # statement's start).
    lock_clause = " FOR UPDATE OF s, r" if connection.features.has_select_for_update_of else ""
    return (
        f"SELECT {session.columns}, {_extras(vendor)}, {run.columns} FROM {_table(ChatSession)} s "
        f"JOIN {_table(Run)} r ON r.session_id = s.id WHERE r.id = %s{lock_clause}"
    )


def locked_run(run_pk: int) -> tuple[ChatSession, Run] | None:
    """A run and its session (with what `session` reads with it), both row-locked, in one statement;
    None when either is gone."""
    with connection.cursor() as cursor:
        cursor.execute(_locked_run_sql(connection.vendor), [run_pk])
        row = cursor.fetchone()
    if row is None:
        return None
    session_shape, run_shape = _shapes(connection.vendor)
    width = len(session_shape.fields) + EXTRAS
    found, run = session_shape.make(row[: width - EXTRAS]), run_shape.make(row[width:])
    assert isinstance(found, ChatSession) and isinstance(run, Run)
    run.session = _known(found, row[width - EXTRAS : width])
    return found, run


@cache
def _run_sql(where: str, with_session: bool, vendor: str) -> str:
    session, run = _shapes(vendor)
    if with_session:
        return (
            f"SELECT {run.columns}, {session.columns} FROM {_table(Run)} r "
            f"JOIN {_table(ChatSession)} s ON s.id = r.session_id WHERE {where}"
        )
    return f"SELECT {run.columns} FROM {_table(Run)} r WHERE {where}"


def run(where: str, params: Sequence[Any], *, with_session: bool = False) -> Run | None:
    """One run (alias `r`), optionally with its session (alias `s`) attached, in one statement."""
    with connection.cursor() as cursor:
        cursor.execute(_run_sql(where, with_session, connection.vendor), params)
        row = cursor.fetchone()
    if row is None:
        return None
    session_shape, run_shape = _shapes(connection.vendor)
    found = run_shape.make(row[: len(run_shape.fields)])
    assert isinstance(found, Run)
    if with_session:
        found.session = session_shape.make(row[len(run_shape.fields) :])  # type: ignore[assignment]
    return found


@cache
def _runs_sql(where: str, vendor: str) -> str:
    return f"SELECT {_shapes(vendor)[1].columns} FROM {_table(Run)} r WHERE {where}"


def runs(where: str, params: Sequence[Any]) -> list[Run]:
    """Runs (alias `r`) matching `where`, which may end with an ORDER BY."""
    with connection.cursor() as cursor:
        cursor.execute(_runs_sql(where, connection.vendor), params)
        rows = cursor.fetchall()
    shape = _shapes(connection.vendor)[1]
    return [shape.make(row) for row in rows]  # type: ignore[misc]


# --- a session's queue: THE definition, in its two spellings ------------------------------------
# Queued runs are the runs in state `queued`, oldest first by (queue_seq, id). The hot path reads
# one session's queue on every turn, so that read is SQL compiled once (below); a page of sessions
# (the gateway's lists, the admin's changelist) reads every queue of the page in one ORM query,
# whatever its size. Both spellings live here, side by side, so they cannot drift apart; every
# reader of a queue (lifecycle, gateway, admin) calls `queued_runs` or `queued_run_ids`. A queued
# run's place in it (`queue_position`, 1 = next to start) counts the queued runs before it in
# that order.
QUEUED_ORDER = ("queue_seq", "id")
_QUEUED_WHERE = "r.session_id = %s AND r.state = %s ORDER BY r.queue_seq, r.id"


def _queue_sql(vendor: str) -> str:
    """The queued runIds of the session aliased `s`, as one value (`_queue_of` reads it)."""
    if vendor == "postgresql":
        return (
            f"(SELECT array_agg(q.run_id ORDER BY q.queue_seq, q.id) FROM {_table(Run)} q "
            f"WHERE q.session_id = s.id AND q.state = '{RunState.QUEUED.value}')"
        )
    # SQLite's json_group_array keeps no promised order (before 3.44): the order keys go with each runId
    return (
        f"(SELECT json_group_array(json_array(q.queue_seq, q.id, q.run_id)) FROM {_table(Run)} q "
        f"WHERE q.session_id = s.id AND q.state = '{RunState.QUEUED.value}')"
    )


def _queue_of(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list):  # PostgreSQL's array, in order
        return [str(run_id) for run_id in value]
    return [str(run_id) for _seq, _id, run_id in sorted(json.loads(value))]


def known_queue(session: ChatSession) -> list[str] | None:
    """The session's queue as read with its row (`session`, `locked_run`, `keyed_run`) and kept by the
    lifecycle as it changes it under the row's lock; None when not known (read it then)."""
    queue: list[str] | None = getattr(session, QUEUED_IDS, None)
    return queue


def forget_queue(session: ChatSession) -> None:
    if hasattr(session, QUEUED_IDS):
        delattr(session, QUEUED_IDS)


def queued_runs(session_pk: int) -> list[Run]:
    """The session's queued runs, oldest first (compiled: the lifecycle starts and aborts them)."""
    return runs(_QUEUED_WHERE, [session_pk, RunState.QUEUED])


def queued_run_ids(session_pks: Sequence[int]) -> dict[int, list[str]]:
    """The queued runIds of each session, oldest first (sessions without any are absent).

    One session (the common case) is one compiled statement; several are one ORM query.
    """
    if not session_pks:
        return {}
    if len(session_pks) == 1:
        with connection.cursor() as cursor:
            cursor.execute(_queued_ids_sql(connection.vendor), [session_pks[0], RunState.QUEUED])
            ids = [row[0] for row in cursor.fetchall()]
        return {session_pks[0]: ids} if ids else {}
    queued: dict[int, list[str]] = defaultdict(list)
    rows = Run.objects.filter(session_id__in=session_pks, state=RunState.QUEUED).order_by(*QUEUED_ORDER)
    for session_pk, run_id in rows.values_list("session_id", "run_id"):
        queued[session_pk].append(run_id)
    return dict(queued)


@cache
def _queued_ids_sql(vendor: str) -> str:
    return f"SELECT r.run_id FROM {_table(Run)} r WHERE {_QUEUED_WHERE}"


@cache
def _position_sql(vendor: str) -> str:
    """The place in its session's queue of the run aliased `r`, as a subquery (one parameter: `queued`)."""
    return (
        f"(SELECT COUNT(*) + 1 FROM {_table(Run)} q WHERE q.session_id = r.session_id AND q.state = %s "
        "AND (q.queue_seq, q.id) < (r.queue_seq, r.id))"
    )


def queue_position(run_pk: int) -> int | None:
    """The 1-based place of a queued run in its session's queue (None: no such run)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {_position_sql(connection.vendor)} FROM {_table(Run)} r WHERE r.id = %s", [RunState.QUEUED, run_pk]
        )
        row = cursor.fetchone()
    return None if row is None else int(row[0])


# --- a key seen before: its ack from one statement ------------------------------------------------
# A send whose key its session already has is answered from what is stored, without a write (§4),
# as often as a client retries: resends are a load of their own. One statement reads what the ack
# needs: the run, but for what the send carries again itself (its message and attachments: the
# bodies are compared by hash); its session's key and sessionId; and its place in the queue while it
# waits there. The fields not read are deferred (a later access would read them). When the key is
# new to the session, the same statement has read the session as admission needs it (the whole row,
# its runIds, its queue): admission checks it is still so in the statement that inserts the run.
_KEYED_RUN_SKIPPED = ("message", "attachments")
_KEYED_SESSION_FIELDS = ("id", "owner_id", "key", "session_id")


class KeyedRun(NamedTuple):
    run: Run | None  # None: the session has no run under the key
    # with a run: its key and sessionId (`_KEYED_SESSION_FIELDS`), the rest deferred; without: the
    # whole row as read, with its runIds and its queue (as `session` reads it)
    session: ChatSession
    queue_position: int | None  # while the run is queued


@cache
def _keyed_shapes(vendor: str) -> tuple[_Shape, _Shape, _Shape, list[int]]:
    run_fields = [f.attname for f in Run._meta.concrete_fields if f.name not in _KEYED_RUN_SKIPPED]
    whole, keyed = _Shape(ChatSession, "s"), _Shape(ChatSession, "s", _KEYED_SESSION_FIELDS)
    return _Shape(Run, "r", run_fields), whole, keyed, [whole.fields.index(f) for f in keyed.fields]


@cache
def _keyed_sql(vendor: str) -> str:
    run, session, keyed, _slots = _keyed_shapes(vendor)
    # What admission needs of the session, read only when the key is new to it: the rest of its
    # row (a resend's ack needs only `_KEYED_SESSION_FIELDS`), its runIds and its queue.
    quote = connection.ops.quote_name
    columns = ", ".join(
        f"s.{quote(str(f.column))}"
        if f in keyed.fields
        else f"CASE WHEN r.id IS NULL THEN s.{quote(str(f.column))} END"
        for f in session.fields
    )
    extras = ", ".join(f"CASE WHEN r.id IS NULL THEN {extra} END" for extra in _extra_list(vendor))
    return (
        f"SELECT {run.columns}, {columns}, CASE WHEN r.state = %s THEN {_position_sql(vendor)} END, "
        f"{extras} FROM {_table(ChatSession)} s LEFT JOIN {_table(Run)} r ON r.session_id = s.id AND r.run_id = %s "
        "WHERE s.owner_id = %s AND s.key = %s"
    )


def keyed_run(owner_id: int, key: str, run_id: str) -> KeyedRun | None:
    """The run an owner's session key holds under an idempotency key, as its ack needs it, or the
    session as admission needs it when the key is new to it (one statement); None: no such session."""
    with connection.cursor() as cursor:
        cursor.execute(_keyed_sql(connection.vendor), [RunState.QUEUED, RunState.QUEUED, run_id, owner_id, key])
        row = cursor.fetchone()
    if row is None:
        return None
    run_shape, whole, keyed, slots = _keyed_shapes(connection.vendor)
    width, session_width = len(run_shape.fields), len(whole.fields)
    values = row[width : width + session_width]
    position, extras = row[width + session_width], row[width + session_width + 1 :]
    if row[0] is None:  # (r.id) the key is new to the session
        session = whole.make(values)
        assert isinstance(session, ChatSession)
        return KeyedRun(None, _known(session, extras), None)
    found, session = run_shape.make(row[:width]), keyed.make([values[i] for i in slots])
    assert isinstance(found, Run) and isinstance(session, ChatSession)
    found.session = session
    return KeyedRun(found, session, None if position is None else int(position))


def next_queue_seq(session_pk: int) -> int:
    """One past the session's highest queue position."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COALESCE(MAX(queue_seq), 0) + 1 FROM {_table(Run)} WHERE session_id = %s", [session_pk])
        return int(cursor.fetchone()[0])  # type: ignore[index]


# --- writes: the same statements the ORM would issue, without building them each time -------------


# Fields whose Python value is what the database takes: no per-value preparation needed.
_PLAIN = (models.CharField, models.TextField, models.IntegerField, models.BooleanField, models.ForeignKey)
_Prep = Callable[[Model, bool], Any]


def _preparer(field: Field[Any, Any]) -> _Prep:
    """How `save()` turns one field of an instance into a query parameter, minus what is a no-op."""
    if isinstance(field, _PLAIN) and not isinstance(field, models.AutoField):
        attname = field.attname
        return lambda instance, add: getattr(instance, attname)
    return lambda instance, add: field.get_db_prep_save(field.pre_save(instance, add), connection)


@cache
def _insert_sql(model: type[Model], vendor: str) -> tuple[str, tuple[_Prep, ...]]:
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    quote = connection.ops.quote_name
    columns = ", ".join(quote(str(f.column)) for f in fields)
    marks = ", ".join(["%s"] * len(fields))
    pk = quote(str(model._meta.pk.column))  # type: ignore[union-attr]
    sql = f"INSERT INTO {_table(model)} ({columns}) VALUES ({marks}) RETURNING {pk}"
    return sql, tuple(_preparer(f) for f in fields)  # type: ignore[arg-type]


def insert(instance: M) -> M:
    """Insert a new instance (defaults and auto_now_add filled as `save()` would); set its pk."""
    sql, preparers = _insert_sql(type(instance), connection.vendor)
    params = [prep(instance, True) for prep in preparers]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        instance.pk = cursor.fetchone()[0]  # type: ignore[index]
    instance._state.adding = False
    instance._state.db = connection.alias
    return instance


@cache
def _insert_many_sql(model: type[Model], rows: int, vendor: str) -> tuple[str, tuple[_Prep, ...]]:
    sql, preparers = _insert_sql(model, vendor)
    head, _returning = sql.rsplit(" RETURNING ", 1)
    columns, marks = head.split(" VALUES ", 1)
    return f"{columns} VALUES {', '.join([marks] * rows)}", preparers


def _rows_sql(instances: Sequence[Model]) -> tuple[str, list[Any]]:
    """One INSERT of new instances of one model, and its parameters (no pks read back)."""
    sql, preparers = _insert_many_sql(type(instances[0]), len(instances), connection.vendor)
    return sql, [prep(instance, True) for instance in instances for prep in preparers]


def _inserted(instances: Sequence[Model]) -> None:
    for instance in instances:
        instance._state.adding = False
        instance._state.db = connection.alias


def insert_many(instances: Sequence[Model]) -> None:
    """Insert new instances of one model in one statement (their pks are not read back)."""
    if len(instances) == 1:
        insert(instances[0])
        return
    sql, params = _rows_sql(instances)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
    _inserted(instances)


def insert_models(groups: Sequence[Sequence[Model]]) -> None:
    """Insert new instances of several models: on PostgreSQL in one statement (each model's INSERT
    but the last in a data-modifying WITH, which runs whether or not it is read), elsewhere one
    statement per model."""
    if connection.vendor != "postgresql" or len(groups) < 2:
        for same in groups:
            insert_many(same)
        return
    parts = [_rows_sql(same) for same in groups]
    with_parts = ", ".join(f"i{n} AS ({sql})" for n, (sql, _params) in enumerate(parts[:-1]))
    params = [param for _sql, part_params in parts for param in part_params]
    with connection.cursor() as cursor:
        cursor.execute(f"WITH {with_parts} {parts[-1][0]}", params)
    for same in groups:
        _inserted(same)


_held = threading.local()


@contextmanager
def inserts_together() -> Iterator[None]:
    """The rows `insert_later` is given inside the block go in when it ends, in one statement on
    PostgreSQL, one per model elsewhere (`insert_models`; none if it raises: its transaction, or
    savepoint, is then undone anyway). Nested blocks are one."""
    if getattr(_held, "rows", None) is not None:
        yield
        return
    rows: list[Model] = []
    _held.rows = rows
    try:
        yield
    finally:
        _held.rows = None
    by_model: dict[type[Model], list[Model]] = {}
    for row in rows:
        by_model.setdefault(type(row), []).append(row)
    insert_models(list(by_model.values()))


def insert_later(instance: Model) -> None:
    """Insert a new instance now, or with the others when the `inserts_together` block around ends."""
    rows: list[Model] | None = getattr(_held, "rows", None)
    if rows is None:
        insert(instance)
    else:
        rows.append(instance)


@cache
def _insert_current_sql(vendor: str) -> tuple[str, tuple[_Prep, ...]]:
    fields = [f for f in Run._meta.concrete_fields if not f.primary_key and f.name != "queue_seq"]
    quote = connection.ops.quote_name
    runs = _table(Run)
    columns = ", ".join(quote(str(f.column)) for f in fields)
    marks = ", ".join(["%s"] * len(fields))
    same = "IS" if vendor == "sqlite" else "IS NOT DISTINCT FROM"  # (equal, or both NULL)
    lock = " FOR UPDATE OF s" if connection.features.has_select_for_update_of else ""
    key = ", ".join(quote(str(f.column)) for f in fields if f.name in ("session", "run_id"))
    sql = (
        f"INSERT INTO {runs} ({columns}, {quote('queue_seq')}) "
        f"SELECT {marks}, (SELECT COALESCE(MAX(q.queue_seq), 0) + 1 FROM {runs} q WHERE q.session_id = s.id) "
        f"FROM {_table(ChatSession)} s WHERE s.id = %s AND s.version = %s AND s.active_run_id {same} %s{lock} "
        f"ON CONFLICT ({key}) DO NOTHING RETURNING id, queue_seq"
    )
    return sql, tuple(_preparer(f) for f in fields)  # type: ignore[arg-type]


def insert_run_if_current(run: Run, session: ChatSession) -> bool:
    """Insert a new run of `session` (its `queue_seq` one past the session's highest) if the session is
    still as read (its `version` and active run) and the run's key is still free: one statement, which
    takes the session's row lock where the database has row locks. False, with nothing written, when
    not: admission then decides under the lock, reading the session again."""
    sql, preparers = _insert_current_sql(connection.vendor)
    params = [prep(run, True) for prep in preparers]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, session.pk, session.version, session.active_run_id])
        row = cursor.fetchone()
    if row is None:
        return False
    run.pk, run.queue_seq = row[0], int(row[1])
    run._state.adding = False
    run._state.db = connection.alias
    return True


@cache
def _update_sql(model: type[Model], names: tuple[str, ...], vendor: str) -> tuple[str, tuple[_Prep, ...]]:
    fields = [model._meta.get_field(name) for name in names]
    quote = connection.ops.quote_name
    sets = ", ".join(f"{quote(str(f.column))} = %s" for f in fields)  # type: ignore[union-attr]
    pk = quote(str(model._meta.pk.column))  # type: ignore[union-attr]
    return f"UPDATE {_table(model)} SET {sets} WHERE {pk} = %s", tuple(_preparer(f) for f in fields)  # type: ignore[arg-type]


def update(instance: Model, *names: str) -> None:
    """`instance.save(update_fields=names)` in one precompiled statement."""
    sql, preparers = _update_sql(type(instance), tuple(dict.fromkeys(names)), connection.vendor)
    params = [prep(instance, False) for prep in preparers]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, instance.pk])


def run_id_of(session: ChatSession, relation: str) -> str | None:
    """The runId of the session's `active_run` or `last_run`: known, read with the row, or looked up."""
    if getattr(session, f"{relation}_id") is None:
        return None
    field = ChatSession._meta.get_field(relation)
    if field.is_cached(session):  # type: ignore[union-attr]
        cached = getattr(session, relation)
        return None if cached is None else str(cached.run_id)
    known = getattr(session, ACTIVE_RUN_ID if relation == "active_run" else LAST_RUN_ID, None)
    if known is not None:
        return str(known)
    related = getattr(session, relation)
    return None if related is None else str(related.run_id)
