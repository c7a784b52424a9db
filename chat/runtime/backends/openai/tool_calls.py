"""The tool calls of one streamed response, put together from their fragments (TOOLS.md §13)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from chat.runtime.tools.host import MAX_ARGUMENT_BYTES, ModelCall

# What one step may ask for: more calls are ignored, longer arguments are cut (the
# host then fails the call as too large) — a server must not make us hold unbounded text.
MAX_CALLS_PER_STEP = 128
MAX_ARGUMENT_CHARS = 2 * MAX_ARGUMENT_BYTES
MAX_CALL_ID = 128


@dataclass
class _PartialCall:
    """A tool call being streamed."""

    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    size: int = 0


class StreamedCalls:
    """One attempt's tool calls, by the index the server streams them under."""

    def __init__(self) -> None:
        self._calls: dict[int, _PartialCall] = {}

    def add(self, fragment: Any) -> None:
        """One streamed piece of a tool call: id and name come first, arguments in pieces, by `index`."""
        index = getattr(fragment, "index", None)
        call_id = getattr(fragment, "id", None) or ""
        if not isinstance(index, int):  # a server that leaves out the index: a new id starts a call
            known = next((i for i, c in self._calls.items() if call_id and c.id == call_id), None)
            if known is not None:
                index = known
            elif call_id or not self._calls:
                index = max(self._calls, default=-1) + 1
            else:
                index = max(self._calls)
        call = self._calls.get(index)
        if call is None:
            if len(self._calls) >= MAX_CALLS_PER_STEP:
                return
            call = self._calls[index] = _PartialCall()
        if call_id and not call.id:
            call.id = str(call_id)
        function = getattr(fragment, "function", None)
        name = getattr(function, "name", None) if function is not None else None
        if name and not call.name:
            call.name = str(name)[:200]
        arguments = getattr(function, "arguments", None) if function is not None else None
        if arguments and call.size <= MAX_ARGUMENT_CHARS:
            call.arguments.append(str(arguments))
            call.size += len(arguments)

    def finish(self, step: int, used_ids: set[str]) -> list[ModelCall]:
        """The calls in index order, each with an id unique in the run (`used_ids`, which this extends)."""
        calls = []
        for number, (_index, partial) in enumerate(sorted(self._calls.items()), start=1):
            call_id = partial.id
            if not call_id or len(call_id) > MAX_CALL_ID or call_id in used_ids:
                call_id = f"call_{step}_{number}_{secrets.token_hex(4)}"
            used_ids.add(call_id)
            calls.append(ModelCall(call_id, partial.name, "".join(partial.arguments)))
        return calls
