"""The few reads of the hot path, as SQL compiled once instead of on every call.

Every turn reads a session (locked, with the runIds its row names) and a run a few
times. Building those statements with the ORM costs more than running them, so they
are composed once per process from the models' metadata and executed directly; the
rows become model instances through the fields' own database converters, exactly as
the ORM would make them. Everything else goes through the ORM.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any, TypeVar

from django.db import connection, models
from django.db.models import Field, Model

from sessions_app.models import ChatSession, Run, RunState

M = TypeVar("M", bound=Model)
# attribute names of the runIds a session row names (see `run_id_of`)
ACTIVE_RUN_ID = "_active_run_rid"
LAST_RUN_ID = "_last_run_rid"


class _Shape:
    """The columns of one model in a SELECT, and how to turn them back into an instance."""

    def __init__(self, model: type[Model], alias: str) -> None:
        self.model = model
        self.fields: list[Field[Any, Any]] = list(model._meta.concrete_fields)  # type: ignore[arg-type]
        self.names = [f.attname for f in self.fields]
        quote = connection.ops.quote_name
        self.columns = ", ".join(f"{alias}.{quote(str(f.column))}" for f in self.fields)
        self.converters = []
        for f in self.fields:
            col = f.get_col(alias)
            # as the ORM's compiler does: the backend's converters, then the field's
            self.converters.append((col, connection.ops.get_db_converters(col) + col.get_db_converters(connection)))

    def make(self, values: Sequence[Any]) -> Model:
        converted = []
        for value, (col, converters) in zip(values, self.converters, strict=True):
            for convert in converters:
                value = convert(value, col, connection)
            converted.append(value)
        return self.model.from_db(connection.alias, self.names, converted)


@cache
def _shapes(vendor: str) -> tuple[_Shape, _Shape]:
    return _Shape(ChatSession, "s"), _Shape(Run, "r")


def _table(model: type[Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


@cache
def _session_sql(where: str, lock: bool, vendor: str) -> str:
    session, _run = _shapes(vendor)
    # FOR UPDATE only where the database has it (SQLite's IMMEDIATE transactions serialise writers)
    lock_clause = " FOR UPDATE OF s" if lock and connection.features.has_select_for_update_of else ""
    return (
        f"SELECT {session.columns}, a.run_id, l.run_id FROM {_table(ChatSession)} s "
        f"LEFT JOIN {_table(Run)} a ON a.id = s.active_run_id "
        f"LEFT JOIN {_table(Run)} l ON l.id = s.last_run_id "
        f"WHERE {where}{lock_clause}"
    )


def session(where: str, params: Sequence[Any], *, lock: bool = False) -> ChatSession | None:
    """One session with the runIds its row names, in one statement (`where` uses alias `s`)."""
    with connection.cursor() as cursor:
        cursor.execute(_session_sql(where, lock, connection.vendor), params)
        row = cursor.fetchone()
    if row is None:
        return None
    shape = _shapes(connection.vendor)[0]
    found = shape.make(row[:-2])
    setattr(found, ACTIVE_RUN_ID, row[-2])
    setattr(found, LAST_RUN_ID, row[-1])
    assert isinstance(found, ChatSession)
    return found


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
# reader of a queue (lifecycle, gateway, admin) calls `queued_runs` or `queued_run_ids`.
QUEUED_ORDER = ("queue_seq", "id")
_QUEUED_WHERE = "r.session_id = %s AND r.state = %s ORDER BY r.queue_seq, r.id"


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
