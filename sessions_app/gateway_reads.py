"""Reads for the gateway: sessions, runs and transcripts, as models.

Encoding them for the wire is the gateway's business (`chat.protocol.wire`). A session's
queued runIds, for one session or a page, are `statements.queued_run_ids` (which owns both
the compiled hot-path read and the ORM read of a page).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Exists, F, OuterRef, Q, QuerySet

from sessions_app import branches, files, statements
from sessions_app.models import (
    ACTIVE_STATES,
    OPEN_STATES,
    STEER,
    TOOL_TERMINAL_STATES,
    ChatSession,
    CommandReceipt,
    Message,
    Run,
    RunFile,
    RunState,
    RunSurface,
    SessionKind,
    ToolApproval,
    ToolCall,
    ToolCallState,
)
from sessions_app.run_requests import RunRequest

# A session with the runs its row names, read in one statement: a row read in two steps
# could be split by a delete (a `running` row whose active run is already gone).
_HEAVY_RUN_FIELDS = ("message", "reply", "attachments", "error_message")


def sessions_with_runs() -> QuerySet[ChatSession]:
    related = ("active_run", "last_run")
    return ChatSession.objects.select_related(*related).defer(
        *(f"{rel}__{name}" for rel in related for name in _HEAVY_RUN_FIELDS)
    )


def session_by_pk(session_pk: int) -> ChatSession | None:
    return statements.session("s.id = %s", [session_pk])


def queues_of(sessions: Sequence[ChatSession]) -> dict[int, list[str]]:
    """The queued runIds of each of these sessions, oldest first: what their rows show as `queuedRunIds`
    (sessions without any are absent). A queue known with its row (`statements.known_queue`) is not
    read again."""
    known = {s.pk: queue for s in sessions if (queue := statements.known_queue(s)) is not None}
    queues = statements.queued_run_ids([s.pk for s in sessions if s.pk not in known])
    queues.update((pk, list(queue)) for pk, queue in known.items() if queue)
    return queues


def find_session(owner_id: int, key: str) -> ChatSession | None:
    return statements.session("s.owner_id = %s AND s.key = %s", [owner_id, key])


def create_retry(owner_id: int, key: str, run_id: str, *, derived: bool) -> ChatSession | None:
    """The session a `sessions.create` with a first message under `run_id` made before, when this
    create (whose key exists) is its retry: the session holds that run or that command, or, for a
    key derived from `run_id`, holds nothing yet (the first attempt stored no message). Else None:
    the key belongs to another session, and the create is a conflict."""
    session = find_session(owner_id, key)
    if session is None:
        return None
    if (
        Run.objects.filter(session=session, run_id=run_id).exists()
        or CommandReceipt.objects.filter(session=session, key=run_id).exists()
    ):
        return session
    if derived and not Message.objects.filter(session=session).exists() and not session.runs.exists():
        return session
    return None


def owner_sessions(owner_id: int | None) -> QuerySet[ChatSession]:
    """Sessions of one owner, or all sessions when owner_id is None (admin scope)."""
    qs = sessions_with_runs()
    return qs if owner_id is None else qs.filter(owner_id=owner_id)


@dataclass
class SessionPage:
    sessions: list[ChatSession]
    total: int


def list_sessions(
    owner_id: int,
    *,
    limit: int = 100,
    offset: int = 0,
    status: str | None = None,
    active_only: bool = False,
    search: str | None = None,
    agent_id: str | None = None,
    updated_since: datetime | None = None,
    kinds: Sequence[str] = (SessionKind.DIRECT,),
) -> SessionPage:
    """One page of an owner's sessions of these kinds (of one agent, or all; changed since a time,
    or ever), newest `updated_at` first."""
    qs = owner_sessions(owner_id).filter(kind__in=list(kinds))
    if agent_id is not None:
        qs = qs.filter(agent_id=agent_id)
    if updated_since is not None:
        qs = qs.filter(updated_at__gte=updated_since)
    if active_only or status == "running":
        qs = qs.filter(active_run__isnull=False)
    elif status == "none":
        qs = qs.filter(status__isnull=True)
    elif status:
        qs = qs.filter(status=status, active_run__isnull=True)
    if search:
        qs = qs.filter(Q(key__icontains=search) | Q(label__icontains=search))
    total = qs.count()
    return SessionPage(list(qs.order_by("-updated_at", "-id")[offset : offset + limit]), total)


@dataclass
class Transcript:
    """One page of a session generation's transcript, with its open runs."""

    messages: list[Message]
    has_more: bool
    runs: dict[int, Run]  # the messages' runs by pk (runId, outcome, timings, usage)
    active: Run | None = None
    queued: list[Run] = field(default_factory=list)
    tools: dict[int, list[ToolCall]] = field(default_factory=dict)  # run pk -> its tool calls, in order
    first_seq: int = 1  # the first message's position in its branch (OpenClaw's `seq`), from 1
    siblings: dict[int, branches.Siblings] = field(default_factory=dict)  # of the messages that have some
    files: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # run pk -> the files it was sent with


def transcript(session: ChatSession, *, limit: int = 200, before_id: int | None = None) -> Transcript:
    """The newest `limit` messages of the active branch before `before_id`, oldest first."""
    oldest_first = branches.active_path(session, limit=limit + 1, before_id=before_id)
    newest_first = list(reversed(oldest_first))
    msgs = list(reversed(newest_first[:limit]))
    run_pks = {m.run_id for m in msgs if m.run_id is not None}
    fields = (
        "pk",
        "run_id",
        "state",
        "dispatched_at",
        "started_at",
        "ended_at",
        "prompt_tokens",
        "completion_tokens",
        "tool_calls",
    )
    # whether a run was sent with files rides with this read: a transcript without any pays no statement
    with_files = Exists(RunFile.objects.filter(run_id=OuterRef("pk")))
    annotated = Run.objects.filter(pk__in=run_pks).only(*fields).annotate(has_files=with_files)
    runs: dict[int, Run] = {r.pk: r for r in annotated}
    sent_files = [r.pk for r in annotated if r.has_files]
    open_runs = list(Run.objects.filter(session=session, state__in=OPEN_STATES).order_by("queue_seq", "id"))
    active = next((r for r in open_runs if r.state in ACTIVE_STATES), None)
    with_tools = {pk for pk, r in runs.items() if r.tool_calls}
    if active is not None and active.tool_calls:
        with_tools.add(active.pk)
    has_more = len(newest_first) > limit
    first_seq = 1
    if msgs and (has_more or before_id is not None):
        # only a page that is not the branch's start needs counting
        first_seq = branches.depth(msgs[0].parent_id) + 1
    return Transcript(
        messages=msgs,
        has_more=has_more,
        first_seq=first_seq,
        siblings=branches.siblings_of(session, msgs),
        runs=runs,
        active=active,
        queued=[r for r in open_runs if r.state == RunState.QUEUED],
        tools=tool_calls_of(with_tools),
        files=files.listed(sent_files) if sent_files else {},
    )


def tool_calls_of(run_pks: set[int]) -> dict[int, list[ToolCall]]:
    """The tool calls of these runs, in call order (one query; none when no run has calls)."""
    found: dict[int, list[ToolCall]] = {}
    if run_pks:
        for call in ToolCall.objects.filter(run_id__in=run_pks).order_by("run_id", "seq"):
            found.setdefault(call.run_id, []).append(call)
    return found


def calls_of_part(message: Message, calls: list[ToolCall]) -> list[ToolCall]:
    """THE rule of which of its run's calls an assistant message carries: those of its steps (a steered
    run's reply is in parts, `lifecycle.core.reply_part`; any other's one message carries them all)."""
    if message.first_step <= 1 and not message.last_step:
        return calls
    return [c for c in calls if c.step >= message.first_step and (not message.last_step or c.step <= message.last_step)]


def tools_of_run(run_pk: int) -> tuple[list[ToolCall], list[ToolApproval]]:
    """A run's tool calls in order, and the approvals of its calls still pending (oldest first)."""
    calls = list(ToolCall.objects.filter(run_id=run_pk).order_by("seq"))
    pending = list(ToolApproval.objects.pending().filter(tool_call__run_id=run_pk).order_by("id"))
    return calls, pending


def client_call_ids(owner_id: int, key: str) -> set[str]:
    """The ids of the calls an owner's session waits on its API client for: those its newest run handed
    over (HTTP-API.md §14.8, "the session's pending calls"). A later run had its turn, so the calls of
    an earlier one, answered or not, are no longer asked for: the runtime would answer none of them."""
    session = find_session(owner_id, key)
    if session is None:
        return set()
    return {call.call_id for call in client_calls_before(session.pk, session.session_id)}


def client_calls_before(session_pk: int, generation: uuid.UUID, *, before_run_pk: int | None = None) -> list[ToolCall]:
    """The calls the session's newest run of this generation (older than `before_run_pk`) handed to the
    API client (state `client`), in call order: what the next request's tool results answer
    (HTTP-API.md §14.4). [] when that run handed none."""
    runs = Run.objects.filter(session_id=session_pk, session_generation=generation)
    if before_run_pk is not None:
        runs = runs.filter(pk__lt=before_run_pk)
    newest = runs.order_by("-id").values_list("pk", "tool_calls").first()
    if newest is None or not newest[1]:
        return []
    return list(ToolCall.objects.filter(run_id=newest[0], state=ToolCallState.CLIENT).order_by("seq"))


def requests_of(run_pks: set[int]) -> dict[int, RunRequest]:
    """The HTTP requests of those of these runs that had one (what they brought: a stateless request's
    earlier messages, results for calls handed to the client), by run (one query; none without runs)."""
    found: dict[int, RunRequest] = {}
    if run_pks:
        for pk, data in Run.objects.filter(pk__in=run_pks, request__isnull=False).values_list("pk", "request"):
            found[pk] = RunRequest.from_json(data)
    return found


def find_run(owner_id: int, key: str, run_id: str) -> statements.KeyedRun | None:
    """The run of an owner's session key by its idempotency key, with its session and its place in
    the queue: what a resend's ack needs; or, the key new to the session, the session as admission
    needs it; in one statement (`statements.keyed_run`). None: no such session."""
    return statements.keyed_run(owner_id, key, run_id)


def find_run_of_owner(owner_id: int, run_id: str, key: str | None = None) -> Run | None:
    """The owner's run with this runId (in this session key, if given), with its session.

    A runId is unique within its session only; used in several sessions, the newest run is meant.
    """
    qs = Run.objects.select_related("session").filter(session__owner_id=owner_id, run_id=run_id)
    if key is not None:
        qs = qs.filter(session__key=key)
    return qs.order_by("-created_at", "-id").first()


def find_http_run(owner_id: int, run_id: str) -> Run | None:
    """The owner's HTTP run under this idempotency key, in any session, with its session: a key of
    the HTTP API is the caller's, whichever session its request named (HTTP-API.md §14.6)."""
    qs = Run.objects.select_related("session").filter(
        session__owner_id=owner_id, run_id=run_id, surface=RunSurface.HTTP
    )
    return qs.order_by("-created_at", "-id").first()


def find_sessions(
    owner_id: int,
    *,
    agent_id: str | None = None,
    session_id: uuid.UUID | None = None,
    label: str | None = None,
    key_contains: str | None = None,
    limit: int = 50,
) -> list[ChatSession]:
    """An owner's sessions matching what a client knows of one (its sessionId, exact label, part
    of its key), ready for `wire.session_rows`, newest first."""
    qs = owner_sessions(owner_id)
    if agent_id is not None:
        qs = qs.filter(agent_id=agent_id)
    if session_id is not None:
        qs = qs.filter(session_id=session_id)
    if label is not None:
        qs = qs.filter(label=label)
    if key_contains is not None:
        qs = qs.filter(key__icontains=key_contains)
    return list(qs.order_by("-updated_at", "-id")[:limit])


def get_run(pk: int) -> Run | None:
    return statements.run("r.id = %s", [pk], with_session=True)


def queue_position(run: Run) -> int | None:
    """1-based position of a queued run in its session's queue (`statements.queue_position`)."""
    if run.state != RunState.QUEUED:
        return None
    return statements.queue_position(run.pk)


def context_messages(run: Run, *, limit: int) -> list[Message]:
    """The newest `limit` messages of the run's branch up to its prompt, oldest first (a backend's context):
    its own user message, or the one it answers again (`Run.prompt`), and that message's parents. While
    the run is active its prompt is the session's active leaf: this is the active branch.

    Inline commands and their answers (/status, /think, ...) are the gateway's, not the
    conversation's: no model reads them.
    """
    if limit <= 0:
        return []
    prompt = run.prompt_id or prompt_of(run)
    return branches.path(prompt, limit=limit, conversation=True)


def reply_of(run_pk: int) -> int | None:
    """The reply message a run added to its session's current transcript (None: none, or not current):
    its last part, for a steered run's reply comes in parts around the steering messages."""
    replies = Message.objects.filter(
        run_id=run_pk, role="assistant", session_id=F("run__session_id"), session_generation=F("session__session_id")
    )
    return replies.order_by("-id").values_list("pk", flat=True).first()


def prompt_of(run: Run) -> int | None:
    """The user message a run added (None: none, a run that never started or of an older transcript)."""
    own = Message.objects.filter(run=run, role="user", command_key="").values_list("pk", flat=True).first()
    return own if own is not None else run.prompt_id


def open_run_counts(owner_id: int | None = None) -> tuple[int, int]:
    """THE open-run counts: (active, queued) runs of the whole gateway, or of one owner's sessions.

    The `health` method and the `/metrics` gauges both read these, so they cannot disagree.
    """
    runs = Run.objects.all() if owner_id is None else Run.objects.filter(session__owner_id=owner_id)
    active = runs.filter(state__in=ACTIVE_STATES).count()
    queued = runs.filter(state=RunState.QUEUED).count()
    return active, queued


# --- repair (§9) and reconcile: what the gateway's background passes read ------------------------


def _after(qs: QuerySet[Any], ts: str, cursor: tuple[datetime, int] | None, since: datetime) -> QuerySet[Any]:
    """Rows past a keyset `cursor` (timestamp, pk), or from `since` on when there is none."""
    if cursor is not None:
        at, pk = cursor
        return qs.filter(Q(**{f"{ts}__gt": at}) | Q(**{ts: at, "pk__gt": pk}))
    return qs.filter(**{f"{ts}__gte": since})


def runs_with_sessions(pks: set[int]) -> list[Run]:
    """These runs (those that still exist), each with its session."""
    return list(Run.objects.select_related("session").filter(pk__in=pks))


def ended_runs(
    *, cursor: tuple[datetime, int] | None, since: datetime, owners: set[int] | None, limit: int
) -> list[Run]:
    """Runs that ended in a window, oldest first, with their sessions (of these owners, or all)."""
    qs = _after(Run.objects.select_related("session").exclude(ended_at=None), "ended_at", cursor, since)
    if owners is not None:
        qs = qs.filter(session__owner_id__in=owners)
    return list(qs.order_by("ended_at", "pk")[:limit])


def changed_sessions(
    *, cursor: tuple[datetime, int] | None, since: datetime, owners: set[int] | None, limit: int
) -> list[ChatSession]:
    """Sessions whose row changed in a window, oldest change first, ready for `wire.session_rows`."""
    qs = _after(owner_sessions(None), "updated_at", cursor, since)
    if owners is not None:
        qs = qs.filter(owner_id__in=owners)
    return list(qs.order_by("updated_at", "pk")[:limit])


def existing_session_pks(pks: set[int]) -> set[int]:
    """Which of these sessions still exist."""
    return set(ChatSession.objects.filter(pk__in=pks).values_list("pk", flat=True))


def reconcile_snapshot(server_id: str, local: list[int]) -> tuple[list[int], list[tuple[int, str]]]:
    """(local runs that are no longer active, active runs of this process without a local task)."""
    active = set(Run.objects.filter(pk__in=local, state__in=ACTIVE_STATES).values_list("pk", flat=True))
    ended = [pk for pk in local if pk not in active]
    mine = Run.objects.filter(owner_process=server_id, state__in=ACTIVE_STATES).exclude(pk__in=local)
    return ended, list(mine.values_list("pk", "state"))


def ended_tool_calls(call_ids: set[str]) -> list[ToolCall]:
    """Of these calls, the ones that reached their terminal state, with run and session (repair)."""
    if not call_ids:
        return []
    qs = ToolCall.objects.select_related("run__session").defer(*(f"run__{n}" for n in _HEAVY_RUN_FIELDS))
    return list(qs.filter(call_id__in=call_ids, state__in=TOOL_TERMINAL_STATES))


def resolved_approvals(approval_ids: set[str]) -> list[ToolApproval]:
    """Of these approvals, the ones resolved, with call, run and session (repair)."""
    if not approval_ids:
        return []
    qs = ToolApproval.objects.select_related("tool_call__run__session").defer(
        *(f"tool_call__run__{n}" for n in _HEAVY_RUN_FIELDS)
    )
    return list(qs.filter(approval_id__in=approval_ids).resolved())


def tool_call(pk: int) -> ToolCall:
    return ToolCall.objects.get(pk=pk)


def approval(pk: int) -> ToolApproval:
    return ToolApproval.objects.get(pk=pk)


def pending_approvals(*, user_id: int | None) -> list[ToolApproval]:
    """The pending approvals of one user (None: everyone's, for staff), oldest first, with call, run and session."""
    qs = ToolApproval.objects.pending().select_related("tool_call__run__session")
    if user_id is not None:
        qs = qs.filter(owner_id=user_id)
    return list(qs.order_by("id")[:500])


def steer_waiting(session_pk: int) -> bool:
    """Whether a steer waits in the session's queue (`lifecycle.steering`): a running run's check at each
    boundary, one indexed read."""
    return Run.objects.filter(session_id=session_pk, state=RunState.QUEUED, queue_mode=STEER).exists()
