"""The small interface every agent backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from chat.base import agents
from chat.protocol import sizes
from chat.runtime.backends.attached import wrapped_document
from chat.runtime.tools.host import ToolHost
from sessions_app.lifecycle.usage import CallUsage
from sessions_app.run_requests import RunRequest


class DispatchError(Exception):
    """The run could not start (model unreachable, refused, misconfigured)."""


class BackendError(Exception):
    """The run failed after it started; `kind` is a protocol errorKind."""

    def __init__(self, message: str, kind: str = "backend") -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class BackendTimeout(BackendError):
    """A backend-level timeout (first token, idle): the run ends `timeout`."""

    def __init__(self, message: str) -> None:
        super().__init__(message, kind="timeout")


@dataclass
class RunContext:
    """Everything a backend needs to execute one run."""

    run_pk: int
    run_id: str
    session_key: str
    session_id: str
    agent_id: str
    agent: Mapping[str, Any]  # the agent's settings as configured (`chat.base.agents.Agent.config`)
    message: str
    attachments: list[dict[str, Any]] = field(default_factory=list)
    transcript: list[dict[str, Any]] = field(default_factory=list)  # [{role, text, aborted}] oldest first
    timeout_ms: int = 600_000
    # the session's settings when the run left the queue (docs/protocol-notes.md, "Session settings"):
    # its chosen model ("" = the agent's own; the backend uses it only while the agent lists it) and
    # its thinking level ("" = none chosen)
    model: str = ""
    thinking_level: str = ""
    # reported by the backend; the executor stores them with the run's end
    stop_reason: str = "stop"
    usage: dict[str, int] | None = None
    cancel_ms: int | None = None  # how long releasing its work took, when it timed out
    # Each model call's usage (docs/usage.md): a backend that makes several calls reports each one
    # that ends before its tool calls run to `record_call`, saying whether it means to ask its model
    # again after them (True back: a budget is spent or cannot take that call, the run must stop
    # there, stopReason `budget`), and leaves its last in `calls`, recorded with the run's end.
    # A backend that reports neither is counted from `usage`, else estimated from its text.
    calls: list[CallUsage] = field(default_factory=list)
    record_call: Callable[[CallUsage, bool], Awaitable[bool]] | None = None
    recorded: list[CallUsage] = field(default_factory=list)  # the calls `record_call` recorded
    tools: ToolHost | None = None  # the run's tools (TOOLS.md §13); None when the agent's settings are bad
    # what an HTTP request adds (HTTP-API.md §14.3-14.5; empty for a chat.send), and the calls handed to
    # the API client that the request's `tool_results` answer, oldest first ({id, model_id, name,
    # arguments}: the gateway's toolCallId, the model's id, the function name)
    request: RunRequest = field(default_factory=RunRequest)
    answered_calls: list[dict[str, str]] = field(default_factory=list)

    @property
    def stateless(self) -> bool:
        """The request's own messages are the context, not the session's transcript (§14.3)."""
        return self.request.own_context


def attachment_kind(item: Mapping[str, Any]) -> str:
    """An attachment's kind for a backend's `refusal`: `text` (its text is kept with the run) or `image`."""
    return "text" if item.get("text") is not None else "image"


def inlined_file(name: str | None, text: str, mime: str | None = None) -> str:
    """A document as a model reads it, after the message's text: wrapped as untrusted content."""
    return wrapped_document(name, mime, text)


class AgentBackend(ABC):
    """An agent backend: a setup check before the ack, then start and stream."""

    # how many of the newest transcript messages `start` reads (this run's user message included)
    context_messages: int = 0
    # the kinds of attachment (`attachment_kind`), and of an HTTP request's image and file parts, it can
    # give its model
    attachment_kinds: frozenset[str] = frozenset({"text", "image"})

    def __init__(self, agent_id: str, config: Mapping[str, Any], *, agent: agents.Agent | None = None) -> None:
        self.agent_id = agent_id
        self.config = config
        # the catalog's typed agent (built here for a backend made from a bare config, as tests do)
        self.agent = agent if agent is not None else agents.build(agent_id, config)

    def check_setup(self, message: str, attachments: list[dict[str, Any]]) -> str | None:
        """Return an error text when this send cannot be accepted at all (§4 'fail before the ack')."""
        return None

    def refusal(self, kind: str) -> str | None:
        """Why the backend cannot take an attachment of this kind (`text`, `image`); None when it can."""
        if kind in self.attachment_kinds:
            return None
        taken = " and ".join(sorted(self.attachment_kinds)) or "no"
        return f"agent {self.agent_id!r} accepts only {taken} attachments"

    def uses_tools(self, message: str) -> bool:
        """Whether this run will reach the agent's MCP servers (they are checked before the ack)."""
        return bool(self.config.get("mcp_servers"))

    def takes_steering(self, message: str) -> bool:
        """Whether its runs take steering messages (docs/protocol-notes.md, "Steering"): at the
        boundaries of their steps; a backend that says no has each steer wait as a follow-up."""
        return False

    @abstractmethod
    async def start(self, ctx: RunContext) -> AsyncIterator[str]:
        """Dispatch phase: get ready and return the text stream. Raise DispatchError on failure.

        The returned iterator yields text chunks; cancelling the task must release
        any resource (close the HTTP request).
        """


class CappedStream:
    """A backend's stream cut at `max_bytes` of encoded text (`chat.websocket.outbound`); a cut run ends
    `final` with stopReason `length`, so no event of it can outgrow `maxPayload`.

    A class, not a generator: closing it closes the backend's stream even when it was never
    iterated (an abort before the run started).
    """

    def __init__(self, stream: AsyncIterator[str], ctx: RunContext, max_bytes: int) -> None:
        self.stream = stream
        self.ctx = ctx
        self.left = max_bytes
        self.done = False

    def __aiter__(self) -> CappedStream:
        return self

    async def __anext__(self) -> str:
        if self.done:
            raise StopAsyncIteration
        chunk = await self.stream.__anext__()
        size = sizes.encoded_len(chunk)
        if size <= self.left:
            self.left -= size
            return chunk
        self.done = True
        self.ctx.stop_reason = "length"
        await self.aclose()
        part = sizes.fit_text(chunk, self.left)
        self.left = 0
        if not part:
            raise StopAsyncIteration
        return part

    async def aclose(self) -> None:
        closer = getattr(self.stream, "aclose", None)
        if closer is not None:
            await closer()


def capped(stream: AsyncIterator[str], ctx: RunContext) -> CappedStream:
    """The stream within the reply budget (`GATEWAY_MAX_REPLY_BYTES`)."""
    return CappedStream(stream, ctx, sizes.max_reply_bytes())
