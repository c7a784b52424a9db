"""A run's tools (TOOLS.md §13): the check before a send's ack, and each call from the model to its end.

The backend hands a step's calls to `ToolHost.run_calls`; every change of a call goes through
the lifecycle (`sessions_app.lifecycle.toolcalls`), committed before the next thing happens: the
calls are recorded before any runs, a call is `running` before its request is written, and its
result is committed as its one terminal state before the model sees it. Nothing here retries a
call: a call that did not end by its own result is ended by its run's terminal transition.

While the database is away each of those writes (and reads) waits, as the run's stream does
(`RunDatabaseWait`, the executor's): tried again until the database is back or the run may wait
no longer. A write whose answer was lost may have committed, so a `no` from a retry is checked
by reading the call: a call is sent to its server only once its `running` is known committed,
and a result that cannot be stored within the wait ends the run (`unavailable`), leaving the
call to the run's end, which marks it `unknown`; it is never run again.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol, TypeVar

from django.utils import timezone

from chat.base.db import db_read, db_write
from chat.delivery.broadcaster import broadcaster, tool_message
from chat.protocol import run_events
from chat.runtime.steering import SteerInbox
from chat.runtime.tools.config import ToolConfig, ToolSpec, allowed_collision, config_error, tool_config
from chat.runtime.tools.pool import pool
from chat.runtime.tools.results import ToolServerError, cap_result
from sessions_app import gateway_reads
from sessions_app.lifecycle import toolcalls
from sessions_app.lifecycle.steering import SKIPPED_TEXT
from sessions_app.models import ApprovalDecision, Run, ToolApproval, ToolCall, ToolCallState, ToolErrorKind

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_ARGUMENT_BYTES = 64 * 1024
APPROVAL_POLL_SECONDS = 0.5  # a decision taken on another process is seen within this


async def setup_error(agent_id: str, agent: Mapping[str, Any]) -> str | None:
    """Before the ack: bad settings, a server that cannot start (its tool list is cached after), or
    two of the listed tools the model would know by one function name."""
    problem = config_error(agent)
    if problem:
        return f"agent {agent_id!r}: {problem}"
    servers = agent.get("mcp_servers") or {}
    if not servers:
        return None
    try:
        listed = await pool().list_tools(agent_id, servers)
    except ToolServerError as exc:
        return f"agent {agent_id!r}: {exc.message}"
    problem = allowed_collision(tool_config(agent), listed)
    return f"agent {agent_id!r}: {problem}" if problem else None


@dataclass
class ModelCall:
    """A call as the model asked for it: its own id, the function name, the arguments' JSON text."""

    id: str
    name: str
    arguments: str


@dataclass
class ToolResult:
    """A call's one outcome, as committed: what the model is told."""

    call_id: str  # the gateway's toolCallId
    model_call_id: str
    name: str  # `NAME.tool` (or what the model asked for, when unknown)
    model_name: str  # the function name the model used
    arguments: str
    text: str
    status: str
    is_error: bool


class RunDatabaseWait(Protocol):
    """How a run's database calls wait out an outage (`chat.runtime.executor.DatabaseWait`)."""

    async def patiently(
        self, call: Callable[..., Awaitable[Any]], fn: Callable[..., T], *args: Any, **kwargs: Any
    ) -> T: ...


@dataclass
class _Checked:
    new: toolcalls.NewCall
    spec: ToolSpec | None = None
    args: dict[str, Any] = field(default_factory=dict)


class ToolHost:
    """The tools of one run: what the model may call, and each call carried to its end."""

    def __init__(
        self,
        run: Run,
        agent_id: str,
        config: ToolConfig,
        wait: Callable[[int, float], Awaitable[None]],
        db_wait: RunDatabaseWait,
    ) -> None:
        self.run = run
        self.wait = wait  # until the run's rows change here, or the time passes (`RunExecutor.wait_change`)
        self.db = db_wait  # the run's own: the stream's waits and these add up to one limit
        self.agent_id = agent_id
        self.config = config
        self.specs: list[ToolSpec] = []
        self.loaded = False
        self.calls_made = run.tool_calls
        self.limit_reached = False
        # what must be written before a step's calls are (the run's `running`: `RunExecutor._started`)
        self.before_writes: Callable[[], Awaitable[Any]] | None = None
        # the steering messages the run takes between its steps (docs/protocol-notes.md, "Steering")
        self.steering = SteerInbox(run, db_wait)

    @property
    def configured(self) -> bool:
        return bool(self.config.servers)

    async def load(self) -> list[ToolSpec]:
        """The agent's allowed tools (started and listed once per process; raises ToolServerError)."""
        if not self.loaded:
            listed = await pool().list_tools(self.agent_id, self.config.servers) if self.configured else []
            problem = allowed_collision(self.config, listed)
            if problem:
                raise ToolServerError(problem)  # a list changed since the ack: never guess which tool
            self.specs = [s for s in listed if self.config.allows(s)]
            self.loaded = True
        return self.specs

    def openai_tools(self) -> list[dict[str, Any]]:
        """The tools as OpenAI functions, named `NAME__tool`."""
        return [
            {
                "type": "function",
                "function": {
                    "name": spec.model_name,
                    "description": spec.description[:1024],
                    "parameters": spec.input_schema or {"type": "object", "properties": {}},
                },
            }
            for spec in self.specs
        ]

    def resolve(self, name: str) -> ToolSpec | None:
        """The allowed tool a model (`NAME__tool`) or a script (`NAME.tool`) names."""
        return next((s for s in self.specs if name in (s.model_name, s.qualified)), None)

    # --- one step's calls -------------------------------------------------------------------

    async def run_calls(
        self, step: int, calls: list[ModelCall], reply_offset: int, reply_text: str = "", *, steerable: bool = False
    ) -> list[ToolResult]:
        """Record the step's calls, then carry each to its end, in order; their outcomes as committed.

        Calls past `max_tool_calls` end `failed` without running, and `limit_reached` tells the
        backend to stop (stopReason `tool_limit`). Before each call starts, a steering message waiting
        for the run is taken (`steering`, when the model will be asked again): that call and the
        rest of the step are not started, each ends `skipped` with a result that says so (only for a
        backend that asks the model again after the step: `steerable`). Raises
        CancelledError when the run has ended.
        """
        try:
            await self.load()
        except ToolServerError as exc:
            log.warning("tools of agent %s unavailable: %s", self.agent_id, exc.message)
        checked = [self._check(c, index) for index, c in enumerate(calls)]
        if self.before_writes is not None:
            await self.before_writes()
        recorded = await self.db.patiently(
            db_write,
            toolcalls.record_calls,
            self.run.pk,
            step=step,
            calls=[c.new for c in checked],
            reply_offset=reply_offset,
            recorded_before=self.calls_made,
        )
        if recorded is None:
            raise asyncio.CancelledError()  # the run ended elsewhere (an abort won)
        self.calls_made += len(recorded)
        # steers are taken only when the model will be asked again (not at the step limit)
        steerable = steerable and not self.limit_reached and step < self.config.max_steps
        results = []
        for item, row, asked in zip(checked, recorded, calls, strict=True):
            if item.new.failure is not None:
                await self._finish(row, ToolCallState.FAILED, item.new.failure, True, item.new.error_kind)
            elif steerable and await self.steering.take(step, reply_text):
                await self._finish(row, ToolCallState.SKIPPED, SKIPPED_TEXT, True, ToolErrorKind.SKIPPED)
            else:
                assert item.spec is not None
                await self._run_one(row, item.spec, item.args)
            final = await self.db.patiently(db_read, gateway_reads.tool_call, row.pk)
            results.append(
                ToolResult(
                    call_id=final.call_id,
                    model_call_id=asked.id,
                    name=final.name,
                    model_name=asked.name,
                    arguments=final.arguments,
                    text=final.result,
                    status=final.state,
                    is_error=final.is_error,
                )
            )
        return results

    async def hand_to_client(self, step: int, calls: list[ModelCall], reply_offset: int) -> list[ToolCall]:
        """Record calls of the API client's function tools as handed to it (state `client`): never run
        here, the client runs them (HTTP-API.md §14.4). Raises CancelledError when the run has ended."""
        new = [toolcalls.NewCall(c.id, "", c.name[:128], c.arguments) for c in calls]
        if self.before_writes is not None:
            await self.before_writes()
        recorded = await self.db.patiently(
            db_write,
            toolcalls.hand_to_client,
            self.run.pk,
            step=step,
            calls=new,
            reply_offset=reply_offset,
            recorded_before=self.calls_made,
        )
        if recorded is None:
            raise asyncio.CancelledError()  # the run ended elsewhere (an abort won)
        self.calls_made += len(recorded)
        return recorded

    def _check(self, asked: ModelCall, index: int) -> _Checked:
        """Validate one call before it is recorded: failures never reach a server."""
        spec = self.resolve(asked.name)
        server, tool = (spec.server, spec.tool) if spec else ("", asked.name[:128])
        arguments = asked.arguments
        failure, kind, args = None, "", {}
        if self.calls_made + index >= self.config.max_tool_calls:
            self.limit_reached = True
            failure, kind = (
                f"not run: the run reached its limit of {self.config.max_tool_calls} tool calls",
                ToolErrorKind.LIMIT,
            )
        elif spec is None:
            failure, kind = f"unknown tool {asked.name!r} (not a tool this agent may call)", ToolErrorKind.UNKNOWN_TOOL
        elif len(arguments.encode()) > MAX_ARGUMENT_BYTES:
            arguments = cap_result(arguments, MAX_ARGUMENT_BYTES)
            failure, kind = "arguments larger than 64 KiB", ToolErrorKind.BAD_ARGUMENTS
        else:
            try:
                parsed = json.loads(arguments) if arguments.strip() else {}
            except ValueError as exc:
                parsed, failure, kind = None, f"arguments are not valid JSON: {exc}", ToolErrorKind.BAD_ARGUMENTS
            if failure is None and not isinstance(parsed, dict):
                failure, kind = "arguments must be a JSON object", ToolErrorKind.BAD_ARGUMENTS
            elif isinstance(parsed, dict):
                args = parsed
        new = toolcalls.NewCall(asked.id, server, tool, arguments, failure=failure, error_kind=kind)
        return _Checked(new, spec if failure is None else None, args)

    async def _run_one(self, row: ToolCall, spec: ToolSpec, args: dict[str, Any]) -> None:
        if self.config.needs_approval(spec):
            expires = timezone.now() + timedelta(milliseconds=self.config.approval_timeout_ms)
            approval = await self.db.patiently(db_write, toolcalls.request_approval, row.pk, expires_at=expires)
            if approval is None:
                raise asyncio.CancelledError()
            decision = await self._decision(approval)
            if decision == ApprovalDecision.CANCELLED:
                raise asyncio.CancelledError()  # only its run's end cancels an approval: nothing more to do
            if decision != ApprovalDecision.ALLOW_ONCE:
                return  # denied or expired: the call has ended with it, and the model is told
        if not await self._begin(row):
            raise asyncio.CancelledError()  # its run ended first: it never runs
        try:
            outcome = await pool().call(
                self.agent_id,
                self.config.servers,
                spec.server,
                spec.tool,
                args,
                timeout_s=self.config.tool_timeout_ms / 1000,
                on_progress=lambda p, t, m: self._progress(row, p, t, m),
            )
        except TimeoutError:
            text = f"the tool did not answer within {self.config.tool_timeout_ms} ms (tool_timeout_ms)"
            await self._finish(row, ToolCallState.FAILED, text, True, ToolErrorKind.TOOL_TIMEOUT)
        except ToolServerError as exc:
            await self._finish(row, ToolCallState.FAILED, exc.message, True, exc.kind)
        else:
            text = cap_result(outcome.text, self.config.max_tool_result_bytes)
            state = ToolCallState.FAILED if outcome.is_error else ToolCallState.SUCCEEDED
            await self._finish(row, state, text, outcome.is_error, ToolErrorKind.TOOL_ERROR if outcome.is_error else "")

    async def _begin(self, row: ToolCall) -> bool:
        """Commit the call's `running`: whether it may be sent to its server.

        A `no` may answer a retry whose earlier try committed before its connection broke: the
        call, read, says which (`running` is this runner's own: nothing else starts a call).
        """
        if await self.db.patiently(db_write, toolcalls.begin_call, row.pk):
            return True
        current = await self.db.patiently(db_read, gateway_reads.tool_call, row.pk)
        return current.state == ToolCallState.RUNNING

    async def _finish(self, row: ToolCall, state: str, text: str, is_error: bool, kind: str) -> None:
        """Store the call's outcome, waiting out an outage (past the run's wait: `DatabaseWaitOver`)."""
        if await self.db.patiently(
            db_write, toolcalls.finish_call, row.pk, state, result=text, is_error=is_error, error_kind=kind
        ):
            return
        # An earlier try committed before its connection broke, or the run's end closed the call.
        current = await self.db.patiently(db_read, gateway_reads.tool_call, row.pk)
        if (current.state, current.result) != (state, text):
            raise asyncio.CancelledError()  # the run's end closed it first

    async def _decision(self, approval: ToolApproval) -> str:
        """Wait for the approval's decision; at its expiry, resolve it `expired` (fail closed)."""
        while True:
            current = await self.db.patiently(db_read, gateway_reads.approval, approval.pk)
            if current.decision:
                return current.decision
            left = (current.expires_at - timezone.now()).total_seconds()
            if left <= 0:
                expired = await self.db.patiently(db_write, toolcalls.expire_approval, approval.pk)
                if expired is not None and expired.decision:
                    return expired.decision
                continue
            await self.wait(self.run.pk, min(left, APPROVAL_POLL_SECONDS))

    async def _progress(self, row: ToolCall, progress: float, total: float | None, message: str | None) -> None:
        """MCP progress, as a `tool` update (not stored: the result is what counts)."""
        data = {
            "phase": "update",
            "name": row.name,
            "toolCallId": row.call_id,
            "partialResult": {"progress": progress, "total": total, "message": (message or "")[:500]},
        }
        session = self.run.session
        agent = run_events.agent_event(self.run, session.key, self.run.stream_seq, "tool", data)
        broadcaster.send(session.owner_id, tool_message(session.owner_id, self.run.pk, row.call_id, "update", agent))
