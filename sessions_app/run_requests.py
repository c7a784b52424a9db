"""What an HTTP request adds to its run (HTTP-API.md §14.3-14.5), stored on the run as JSON.

A `chat.send` has none: its session's transcript and its message are the whole input. An HTTP run
may bring instructions, the context of a stateless request, sampling parameters, client function
tools and the results of earlier client calls; the executor hands them to the backend.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class ClientTool:
    """A client function tool (HTTP-API.md §14.4): offered to the model, handed back to the client."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)  # JSON Schema


@dataclass
class ToolResult:
    """A client's result for a call it was handed (`role: "tool"` / `function_call_output`)."""

    call_id: str
    output: str


@dataclass
class RunRequest:
    """The HTTP additions to one run; every field empty means "as a chat.send"."""

    # system/developer messages and `instructions`, added to the agent's system prompt (§14.3)
    instructions: list[str] = field(default_factory=list)
    # a stateless request's earlier messages, oldest first, in Chat Completions' message shape
    # ({"role", "content", "tool_calls"?, "tool_call_id"?}); the run's own message is not among them
    context: list[dict[str, Any]] = field(default_factory=list)
    # results of client calls, the run's new input when it continues after `finish_reason: "tool_calls"`
    tool_results: list[ToolResult] = field(default_factory=list)
    client_tools: list[ClientTool] = field(default_factory=list)
    # "auto" | "none" | "required" | {"name": ...} (a forced function); "" = not given (auto)
    tool_choice: str | dict[str, Any] = ""
    # sampling parameters as the backend's model API names them (temperature, top_p, max_tokens, stop,
    # seed, presence_penalty, frequency_penalty, parallel_tool_calls); absent = the agent's default
    params: dict[str, Any] = field(default_factory=dict)
    reasoning_effort: str = ""  # as the session's thinking level would be; "" = the session's
    model: str = ""  # another of the agent's models (x-agentgate-model); "" = the session's / agent's
    user: str = ""  # OpenAI's `user` field: recorded, never used to pick a session
    metadata: dict[str, str] = field(default_factory=dict)
    # the request named no session (no header, no chain): its messages are the run's whole context, even
    # when they are only the new input (an empty `context`)
    stateless: bool = False

    @property
    def own_context(self) -> bool:
        """Whether the run's context is the request's messages rather than its session's transcript: a
        stateless request, or one that brought earlier messages along (§14.3). A request that continues
        a session (a named one, a chain, also onto a stateless request's `api` session) reads its
        transcript."""
        return self.stateless or bool(self.context)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> RunRequest:
        """The request stored on a run (None for a chat.send: the empty request)."""
        if not data:
            return cls()
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["client_tools"] = [ClientTool(**t) for t in known.get("client_tools", [])]
        known["tool_results"] = [ToolResult(**t) for t in known.get("tool_results", [])]
        return cls(**known)
