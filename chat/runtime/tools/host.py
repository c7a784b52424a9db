"""A run's tools (TOOLS.md §13): the agent's configuration, and each call from the model to its end.

The backend hands a step's calls to `ToolHost.run_calls`; every change of a call goes through
the lifecycle (`sessions_app.lifecycle.tools`), committed before the next thing happens: the
calls are recorded before any runs, a call is `running` before its request is written, and its
result is committed as its one terminal state before the model sees it. Nothing here retries a
call: a call that did not end by its own result is ended by its run's terminal transition.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.utils import timezone

from chat.delivery.broadcaster import broadcaster, tool_message
from chat.protocol import wire
from chat.runtime.db import db_read, db_write
from chat.runtime.tools.servers import ToolServerError, ToolSpec, pool, validate_servers
from sessions_app import gateway_reads
from sessions_app.lifecycle import tools
from sessions_app.models import ApprovalDecision, Run, ToolApproval, ToolCall, ToolCallState

log = logging.getLogger(__name__)

MAX_ARGUMENT_BYTES = 64 * 1024
LIMIT_DEFAULTS = {
    "max_tool_calls": 16,
    "max_steps": 8,
    "tool_timeout_ms": 60_000,
    "max_tool_result_bytes": 65_536,
    "approval_timeout_ms": 120_000,
}
TOOL_KEYS = {"mcp_servers", "tools", "approval", *LIMIT_DEFAULTS}
APPROVAL_MODES = ("never", "always", "unless_read_only")
APPROVAL_POLL_SECONDS = 0.5  # a decision taken on another process is seen within this


@dataclass(frozen=True)
class ToolConfig:
    """One agent's tool settings, validated."""

    servers: dict[str, dict[str, Any]]
    allow: tuple[str, ...] | None  # `NAME.tool` / `NAME.*`; None: every tool of its servers
    approval: dict[str, str]
    max_tool_calls: int = 16
    max_steps: int = 8
    tool_timeout_ms: int = 60_000
    max_tool_result_bytes: int = 65_536
    approval_timeout_ms: int = 120_000

    def allows(self, spec: ToolSpec) -> bool:
        if self.allow is None:
            return True
        return spec.qualified in self.allow or f"{spec.server}.*" in self.allow

    def needs_approval(self, spec: ToolSpec) -> bool:
        """The most specific rule wins: `NAME.tool`, then `NAME.*`, then `*`; default unless_read_only."""
        mode = next(
            (self.approval[k] for k in (spec.qualified, f"{spec.server}.*", "*") if k in self.approval),
            "unless_read_only",
        )
        return mode == "always" or (mode == "unless_read_only" and not spec.read_only)


def config_error(agent: dict[str, Any]) -> str | None:
    """What is wrong with an agent's tool settings (TOOLS.md §13.1), or None."""
    servers = agent.get("mcp_servers", {})
    problem = validate_servers(servers) if servers else None
    if problem:
        return problem
    allow = agent.get("tools")
    if allow is not None and (not isinstance(allow, list) or not all(isinstance(t, str) and "." in t for t in allow)):
        return "tools must be a list of 'NAME.tool' or 'NAME.*'"
    approval = agent.get("approval", {})
    if not isinstance(approval, dict) or not all(
        isinstance(k, str) and v in APPROVAL_MODES for k, v in approval.items()
    ):
        return "approval must map 'NAME.tool', 'NAME.*' or '*' to one of " + ", ".join(APPROVAL_MODES)
    for key, default in LIMIT_DEFAULTS.items():
        value = agent.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 100_000_000:
            return f"{key} must be a positive integer"
    return None


def tool_config(agent: dict[str, Any]) -> ToolConfig:
    """The agent's tool settings (validated by `config_error` first)."""
    allow = agent.get("tools")
    return ToolConfig(
        servers=dict(agent.get("mcp_servers") or {}),
        allow=tuple(allow) if allow is not None else None,
        approval=dict(agent.get("approval") or {}),
        **{key: int(agent.get(key, default)) for key, default in LIMIT_DEFAULTS.items()},
    )


async def setup_error(agent_id: str, agent: dict[str, Any]) -> str | None:
    """Before the ack: bad settings, or a server that cannot start (its tool list is cached after)."""
    problem = config_error(agent)
    if problem:
        return f"agent {agent_id!r}: {problem}"
    servers = agent.get("mcp_servers") or {}
    if not servers:
        return None
    try:
        await pool().list_tools(agent_id, servers)
    except ToolServerError as exc:
        return f"agent {agent_id!r}: {exc.message}"
    return None


def cap_result(text: str, max_bytes: int) -> str:
    """The result within `max_bytes` of UTF-8: its head and tail, with a marker saying how much was cut."""
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    keep = max(0, max_bytes - 100)
    head = data[: keep // 2].decode(errors="ignore")
    tail = data[len(data) - keep // 2 :].decode(errors="ignore")
    cut = len(data) - len(head.encode()) - len(tail.encode())
    return f"{head}\n[… {cut} bytes cut …]\n{tail}"


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


@dataclass
class _Checked:
    new: tools.NewCall
    spec: ToolSpec | None = None
    args: dict[str, Any] = field(default_factory=dict)


class ToolHost:
    """The tools of one run: what the model may call, and each call carried to its end."""

    def __init__(
        self, run: Run, agent_id: str, config: ToolConfig, wait: Callable[[int, float], Awaitable[None]]
    ) -> None:
        self.run = run
        self.wait = wait  # until the run's rows change here, or the time passes (`RunExecutor.wait_change`)
        self.agent_id = agent_id
        self.config = config
        self.specs: list[ToolSpec] = []
        self.loaded = False
        self.calls_made = run.tool_calls
        self.limit_reached = False

    @property
    def configured(self) -> bool:
        return bool(self.config.servers)

    async def load(self) -> list[ToolSpec]:
        """The agent's allowed tools (started and listed once per process; raises ToolServerError)."""
        if not self.loaded:
            listed = await pool().list_tools(self.agent_id, self.config.servers) if self.configured else []
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

    async def run_calls(self, step: int, calls: list[ModelCall], reply_offset: int) -> list[ToolResult]:
        """Record the step's calls, then carry each to its end, in order; their outcomes as committed.

        Calls past `max_tool_calls` end `failed` without running, and `limit_reached` tells the
        backend to stop (stopReason `tool_limit`). Raises CancelledError when the run has ended.
        """
        try:
            await self.load()
        except ToolServerError as exc:
            log.warning("tools of agent %s unavailable: %s", self.agent_id, exc.message)
        checked = [self._check(c, index) for index, c in enumerate(calls)]
        recorded = await db_write(
            tools.record_calls, self.run.pk, step=step, calls=[c.new for c in checked], reply_offset=reply_offset
        )
        if recorded is None:
            raise asyncio.CancelledError()  # the run ended elsewhere (an abort won)
        self.calls_made += len(recorded)
        results = []
        for item, row, asked in zip(checked, recorded, calls, strict=True):
            if item.new.failure is not None:
                await self._finish(row, ToolCallState.FAILED, item.new.failure, True, item.new.error_kind)
            else:
                assert item.spec is not None
                await self._run_one(row, item.spec, item.args)
            final = await db_read(gateway_reads.tool_call, row.pk)
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

    def _check(self, asked: ModelCall, index: int) -> _Checked:
        """Validate one call before it is recorded: failures never reach a server."""
        spec = self.resolve(asked.name)
        server, tool = (spec.server, spec.tool) if spec else ("", asked.name[:128])
        arguments = asked.arguments
        failure, kind, args = None, "", {}
        if self.calls_made + index >= self.config.max_tool_calls:
            self.limit_reached = True
            failure, kind = f"not run: the run reached its limit of {self.config.max_tool_calls} tool calls", "limit"
        elif spec is None:
            failure, kind = f"unknown tool {asked.name!r} (not a tool this agent may call)", "unknown_tool"
        elif len(arguments.encode()) > MAX_ARGUMENT_BYTES:
            arguments = cap_result(arguments, MAX_ARGUMENT_BYTES)
            failure, kind = "arguments larger than 64 KiB", "bad_arguments"
        else:
            try:
                parsed = json.loads(arguments) if arguments.strip() else {}
            except ValueError as exc:
                parsed, failure, kind = None, f"arguments are not valid JSON: {exc}", "bad_arguments"
            if failure is None and not isinstance(parsed, dict):
                failure, kind = "arguments must be a JSON object", "bad_arguments"
            elif isinstance(parsed, dict):
                args = parsed
        new = tools.NewCall(asked.id, server, tool, arguments, failure=failure, error_kind=kind)
        return _Checked(new, spec if failure is None else None, args)

    async def _run_one(self, row: ToolCall, spec: ToolSpec, args: dict[str, Any]) -> None:
        if self.config.needs_approval(spec):
            expires = timezone.now() + timedelta(milliseconds=self.config.approval_timeout_ms)
            approval = await db_write(tools.request_approval, row.pk, expires_at=expires)
            if approval is None:
                raise asyncio.CancelledError()
            decision = await self._decision(approval)
            if decision == ApprovalDecision.CANCELLED:
                raise asyncio.CancelledError()  # only its run's end cancels an approval: nothing more to do
            if decision != ApprovalDecision.ALLOW_ONCE:
                return  # denied or expired: the call has ended with it, and the model is told
        if not await db_write(tools.begin_call, row.pk):
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
            await self._finish(row, ToolCallState.FAILED, text, True, "tool_timeout")
        except ToolServerError as exc:
            await self._finish(row, ToolCallState.FAILED, exc.message, True, exc.kind)
        else:
            text = cap_result(outcome.text, self.config.max_tool_result_bytes)
            state = ToolCallState.FAILED if outcome.is_error else ToolCallState.SUCCEEDED
            await self._finish(row, state, text, outcome.is_error, "tool_error" if outcome.is_error else "")

    async def _finish(self, row: ToolCall, state: str, text: str, is_error: bool, kind: str) -> None:
        if not await db_write(tools.finish_call, row.pk, state, result=text, is_error=is_error, error_kind=kind):
            raise asyncio.CancelledError()  # the run's end closed it first

    async def _decision(self, approval: ToolApproval) -> str:
        """Wait for the approval's decision; at its expiry, resolve it `expired` (fail closed)."""
        while True:
            current = await db_read(gateway_reads.approval, approval.pk)
            if current.decision:
                return current.decision
            left = (current.expires_at - timezone.now()).total_seconds()
            if left <= 0:
                expired = await db_write(tools.expire_approval, approval.pk)
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
        agent = wire.agent_event(self.run, session.key, self.run.stream_seq, "tool", data)
        broadcaster.send(session.owner_id, tool_message(session.owner_id, self.run.pk, row.call_id, "update", agent))
