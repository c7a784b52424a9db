"""The one way an HTTP request becomes a run (HTTP-API.md §14.3, §14.4, §14.6), for every endpoint.

- The session: a named one (`x-agentgate-session-key` / `x-openclaw-session-key`, or a
  `conversation`): a bare name belongs to the model's agent, a full key of another agent is a 400;
  else a session of its own, kind `api`, for this one request.
- Admission is `chat.methods.send.admission.admit`, the path of every `chat.send`, with the
  request's surface, its additions (`RunRequest`) and the kind of session it creates.
- `Idempotency-Key` is the run's idempotencyKey, scoped to the caller: a retry finds the run
  whatever session it is in. A stateless request with a key gets a session key derived from it
  (`api-` and a digest of the key), so two racing first attempts meet in one session, where the
  unique (session, runId) decides: one run. Racing requests under one key that name different
  sessions meet at the key's own lock in admission (`owner_scoped_key`). The key's run is checked
  against a digest of the whole request (stream flags aside): another body under the same key is a 409.
- A client that leaves: without a key its run is aborted at once (stopReason `disconnect`, through
  chat.abort's lifecycle path; a queued run is removed so); with a key the run is marked detached,
  and the supervisor's sweep aborts it unless a retry reattaches within GATEWAY_HTTP_REATTACH_SECONDS.
  A follower attached to a run clears the mark each time it reads the run (at least once a second).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from chat.base.db import db_read, db_write
from chat.httpapi.errors import NO_RETRY, ApiError, bad_request, from_protocol
from chat.httpapi.follow import Follower
from chat.httpapi.http import DisconnectHook, Request
from chat.methods.registry import call
from chat.methods.send.admission import admit, refuse_unadmitted
from chat.methods.send.params import ChatSendParams
from chat.protocol.errors import ProtocolError
from chat.protocol.fields import RUN_ID_RE
from chat.protocol.keys import canonical_key
from chat.runtime.executor import DatabaseWait
from chat.runtime.gateway import runtime
from sessions_app import gateway_reads
from sessions_app.lifecycle import runs, sessions
from sessions_app.models import Run, RunSurface, SessionKind
from sessions_app.run_requests import RunRequest

SESSION_HEADERS = ("x-agentgate-session-key", "x-openclaw-session-key")
IDEMPOTENCY_HEADER = "idempotency-key"
IDEMPOTENCY_RE = re.compile(r"[\x20-\x7e]{1,128}")  # 1-128 printable ASCII characters
_admitting: set[asyncio.Future[Any]] = set()  # admissions under way (held: their clients may be gone)
# Body fields that change how the answer is carried, not what is asked: a retry may differ in them.
TRANSPORT_FIELDS = ("stream", "stream_options")


@dataclass(frozen=True)
class Target:
    """The session a request runs in."""

    key: str
    agent_id: str
    kind: str  # SessionKind: `direct` for a named session, `api` for a stateless request's own

    @property
    def named(self) -> bool:
        return self.kind == SessionKind.DIRECT


@dataclass
class HttpSend:
    """What an endpoint asks to run: the new input, what the request adds, and the request itself
    (`body`, for the idempotency check)."""

    agent_id: str
    message: str
    request: RunRequest
    body: dict[str, Any]
    attachments: list[dict[str, Any]] = field(default_factory=list)
    timeout_ms: int | None = None
    # called with a new run in the transaction that admits it (a Responses API row; not for a key's run found again)
    on_admitted: Callable[[Run], None] | None = None
    # the message the new user message follows instead of the session's active leaf: the reply of the
    # response a `previous_response_id` continues (its own branch, docs/branches.md)
    follows: int | None = None


@dataclass
class Admitted:
    """The request's run: new, found again under its key while open (`reattached`), or ended (`replay`)."""

    run: Run
    session_key: str
    replay: bool = False
    reattached: bool = False
    keyed: bool = False
    settled: bool = False  # its follower saw it end: the client leaving now changes nothing

    @property
    def headers(self) -> dict[str, str]:
        """The headers of every answer that admitted (or found) a run."""
        found = {"x-agentgate-run-id": self.run.run_id, "x-agentgate-session-key": self.session_key}
        if self.replay:
            found["x-agentgate-idempotent-replay"] = "true"
        return found


def idempotency_key(req: Request) -> str | None:
    """The request's `Idempotency-Key`, or None; a 400 for one that is not 1-128 printable characters."""
    raw = req.headers.get(IDEMPOTENCY_HEADER)
    if raw is None:
        return None
    if not IDEMPOTENCY_RE.fullmatch(raw):
        raise bad_request("Idempotency-Key must be 1 to 128 printable ASCII characters", param="Idempotency-Key")
    return raw


def run_id_for(key: str | None) -> str:
    """The runId of a request: its Idempotency-Key (a digest of it when it has characters a runId
    cannot), or a fresh one."""
    if key is None:
        return f"http-{uuid.uuid4().hex}"
    if RUN_ID_RE.fullmatch(key):
        return key
    return "idem-" + hashlib.sha256(key.encode()).hexdigest()[:40]


def target(req: Request, agent_id: str, *, key: str | None, conversation: str | None = None) -> Target:
    """The session of a request for `agent_id`: named by header or `conversation`, else its own."""
    raw, param = req.header(*SESSION_HEADERS), SESSION_HEADERS[0]
    if raw is None and conversation is not None:
        raw, param = conversation, "conversation"
    if raw is not None:
        name = raw if raw.startswith("agent:") else f"agent:{agent_id}:{raw}"
        try:
            session_key, key_agent = canonical_key(name, field=param)
        except ProtocolError as exc:
            raise from_protocol(exc, param=param) from exc
        if key_agent != agent_id:
            raise bad_request(
                f"session {session_key} belongs to agent {key_agent!r}, not to the model's agent {agent_id!r}",
                param=param,
            )
        return Target(session_key, agent_id, SessionKind.DIRECT)
    suffix = uuid.uuid4().hex if key is None else hashlib.sha256(f"api:{key}".encode()).hexdigest()[:32]
    return Target(f"agent:{agent_id}:api-{suffix}", agent_id, SessionKind.API)


def fingerprint(req: Request, body: dict[str, Any]) -> str:
    """A digest of what a request asks (its body but the transport fields, and the headers that
    choose its session and model): a key reused with another fingerprint is a 409."""
    asked = {k: v for k, v in body.items() if k not in TRANSPORT_FIELDS}
    chosen = {name: req.headers.get(name) for name in (*SESSION_HEADERS, "x-agentgate-model", "x-openclaw-model")}
    material = json.dumps({"body": asked, "headers": chosen}, sort_keys=True, ensure_ascii=False, default=str)
    return "http:" + hashlib.sha256(material.encode()).hexdigest()[:59]


def reused_key() -> ApiError:
    return ApiError(
        409,
        "this Idempotency-Key was already used with a different request",
        param="Idempotency-Key",
        code="idempotency_key_reused",
        headers=dict(NO_RETRY),
    )


async def key_taken(req: Request, key: str | None) -> str | None:
    """The session of the run the request's Idempotency-Key already has, or None. Such a request is a
    retry, answered from that run (`start`) however the session has moved on since, so the checks
    of a new request's content (its files, its tool results, the response it continues) are not
    made again (one read)."""
    if key is None:
        return None
    found = await db_read(gateway_reads.find_http_run, req.user.user_id, run_id_for(key))
    return found.session.key if found is not None else None


async def start(req: Request, send: HttpSend, where: Target, key: str | None, *, watch: bool = True) -> Admitted:
    """Admit the request's run (or find its key's run again), and (`watch`) apply the disconnect rules
    to it; a run that must go on whatever its client does (a background response) is not watched.

    The rule is registered before the admission and the admission is shielded: a client that leaves
    while its run is being admitted cancels its handler, not the admission, and the rule then
    applies to whatever was admitted once it has been."""
    if req.disconnected.is_set():  # gone already: admit nothing (a client leaving from here on is watched)
        raise ApiError(400, "the client left before its request was admitted", code="client_gone")
    admission = asyncio.ensure_future(_admit(req, send, where, key, watch))
    _admitting.add(admission)
    admission.add_done_callback(_admission_done)
    if watch:
        req.on_disconnect(_disconnect_rule(req, admission))
    admitted = await asyncio.shield(admission)
    req.run_headers = admitted.headers
    return admitted


def _admission_done(admission: asyncio.Future[Any]) -> None:
    _admitting.discard(admission)
    if not admission.cancelled():
        admission.exception()  # seen: its client (if still there) was told; else no one is left to tell


async def _admit(req: Request, send: HttpSend, where: Target, key: str | None, watch: bool) -> Admitted:
    """The request's run: admitted, or its key's run found again (reattached or replayed)."""
    caller = req.user
    await runtime.ensure_started()
    run_id = run_id_for(key)
    digest = fingerprint(req, send.body)
    if key is not None:
        found = await db_read(gateway_reads.find_http_run, caller.user_id, run_id)
        if found is not None:
            return await _again(req, found, found.session.key, digest, watch)
    params = ChatSendParams(
        key=where.key,
        agent_id=send.agent_id,
        message=send.message,
        run_id=run_id,
        attachments=send.attachments,
        timeout_ms=send.timeout_ms or settings.GATEWAY_DEFAULT_TIMEOUT_MS,
        surface=RunSurface.HTTP,
        request=send.request.as_json(),
        session_kind=where.kind,
        request_hash=digest,
        on_admitted=send.on_admitted,
        owner_scoped_key=key is not None,
        follows=send.follows,
        api_token_id=caller.token_id,
    )
    try:
        outcome = await admit(caller.user_id, params)
        if outcome.admission == "conflict":
            raise reused_key()
        refuse_unadmitted(outcome)
    except ProtocolError as exc:
        raise from_protocol(exc) from exc
    run = outcome.run
    assert run is not None
    if outcome.admission == "existing":  # a racing attempt under the same key admitted it first
        return await _again(req, run, outcome.session.key, digest, watch)
    return Admitted(run, outcome.session.key, keyed=key is not None)


async def _again(req: Request, run: Run, session_key: str, digest: str, watch: bool) -> Admitted:
    """The run a key already has: its ended answer again, or reattached while it is open."""
    if run.body_hash != digest:
        raise reused_key()
    if run.is_terminal:
        return Admitted(run, session_key, replay=True, keyed=True)
    if watch:
        await db_write(runs.set_detached, run.pk, False)
    return Admitted(run, session_key, reattached=True, keyed=True)


def _disconnect_rule(req: Request, admission: asyncio.Future[Admitted]) -> DisconnectHook:
    """What the client leaving before its answer is done does to its run, once admitted (§14.4):
    without a key the run is aborted (stopReason `disconnect`), with one it is marked detached. Either
    waits out a database outage as the run would (each may be done twice: the second does nothing)."""
    caller = req.user

    async def left() -> None:
        try:
            admitted = await admission
        except Exception:  # nothing was admitted
            return
        run = admitted.run
        if admitted.replay or admitted.settled or run.is_terminal:
            return
        wait = DatabaseWait()
        if admitted.keyed:
            await wait.patiently(db_write, runs.set_detached, run.pk, True, urgent=True)
            return
        await wait.patiently(
            call,
            sessions.abort,
            owner_id=caller.user_id,
            key=admitted.session_key,
            run_id=run.run_id,
            owner_process=runtime.owner_for_new_runs(),
            stop_reason=runs.DISCONNECT,
        )

    return left


def follower(req: Request, admitted: Admitted) -> Follower:
    """The updates of the request's run. Each read keeps a keyed run attached, and marks a run seen
    ended as `settled` (its disconnect rule has nothing left to do)."""

    async def on_read(run: Run) -> None:
        if run.is_terminal:
            admitted.settled = True
        elif admitted.keyed and run.detached_at is not None and not req.disconnected.is_set():
            await db_write(runs.set_detached, run.pk, False)

    caller = req.user
    return Follower(caller.user_id, admitted.run.pk, token_hash=caller.token_hash, on_read=on_read)
