"""The `scripted` demo and test agent (PROTOCOL.md §11)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from chat.runtime.backends.base import AgentBackend, BackendError, DispatchError, RunContext
from chat.runtime.tools.host import ModelCall

DIRECTIVE_RE = re.compile(r"\[\[(delay|tick|words|fail|hang|verbatim)(?::([A-Za-z0-9]+))?\]\]")
# [[tool:NAME.tool {"json": "args"}]] (TOOLS.md §13.8): the arguments end at the first `}]]`
TOOL_RE = re.compile(r"\[\[tool:([A-Za-z0-9_.-]{1,200})(?:\s+(\{.*?\}))?\]\]", re.DOTALL)
MAX_TOOL_DIRECTIVES = 32

# Directives are clamped to these (a demo agent must not be a way to hold memory or a
# run slot for ever); the reply is streamed as it is made, never built up front.
MAX_WORDS = 10_000
MAX_TICK_MS = 10_000
MAX_DELAY_MS = 60_000
MAX_REPLY_CHARS = 100_000


@dataclass
class Script:
    text: str
    delay_ms: int = 0
    tick_ms: int = 20
    words: int | None = None
    fail: str | None = None
    hang: bool = False
    verbatim: bool = False  # keep the text's line breaks and spacing (Markdown demos)
    tools: list[tuple[str, str]] = field(default_factory=list)  # [[tool:...]]: (NAME.tool, arguments JSON)


def parse_script(message: str) -> Script:
    """Split directives out of `message`; what is left (whitespace folded) is the text."""
    script = Script(text="")
    script.tools = [(name, args or "{}") for name, args in TOOL_RE.findall(message)[:MAX_TOOL_DIRECTIVES]]
    message = TOOL_RE.sub(" ", message)
    for name, arg in DIRECTIVE_RE.findall(message):
        if name == "delay" and _digits(arg):
            script.delay_ms = min(int(arg), MAX_DELAY_MS)
        elif name == "tick" and _digits(arg):
            script.tick_ms = min(int(arg), MAX_TICK_MS)
        elif name == "words" and _digits(arg):
            script.words = min(int(arg), MAX_WORDS)
        elif name == "fail" and arg in ("setup", "dispatch", "stream"):
            script.fail = arg
        elif name == "hang":
            script.hang = True
        elif name == "verbatim":
            script.verbatim = True
    if script.verbatim:
        script.text = DIRECTIVE_RE.sub("", message).strip()
    else:
        script.text = " ".join(DIRECTIVE_RE.sub(" ", message).split())
    return script


def _digits(arg: str) -> bool:
    # ASCII digits only, and short: int() of a 4000-digit string is itself a cost
    return arg.isascii() and arg.isdigit() and len(arg) <= 9


def reply_words(script: Script, attachments: list[dict[str, Any]]) -> Iterator[str]:
    """The reply `echo: <text>` as the chunks streamed, one word each, at most MAX_REPLY_CHARS in all.

    With `[[verbatim]]` the reply is `echo:`, a blank line, then the text exactly as sent
    (each chunk a word with the whitespace before it), so Markdown in it stays Markdown.
    """
    budget = MAX_REPLY_CHARS
    for chunk in _chunks(script, attachments):
        if len(chunk) > budget:
            return
        budget -= len(chunk)
        yield chunk


def _chunks(script: Script, attachments: list[dict[str, Any]]) -> Iterator[str]:
    if script.verbatim and script.words is None:
        yield "echo:\n\n"
        for match in re.finditer(r"\s*\S+", script.text):
            yield match.group(0)
        return
    yield "echo:"
    if script.words is not None:
        for i in range(script.words):
            yield f" word{i + 1}"
    else:
        for word in script.text.split():
            yield f" {word}"
    if attachments:
        yield f" (+{len(attachments)} attachment{'s' if len(attachments) > 1 else ''})"


class ScriptedBackend(AgentBackend):
    """Replies `echo: <text>` word by word; directives drive delays and failures."""

    def check_setup(self, message: str, attachments: list[dict[str, Any]]) -> str | None:
        if parse_script(message).fail == "setup":
            return "scripted agent refused the run during setup ([[fail:setup]])"
        return None

    def uses_tools(self, message: str) -> bool:
        return bool(TOOL_RE.search(message)) and super().uses_tools(message)

    async def start(self, ctx: RunContext) -> AsyncIterator[str]:
        script = parse_script(ctx.message)
        if script.delay_ms:
            await asyncio.sleep(script.delay_ms / 1000)  # the run is held in `dispatching`
        if script.fail == "dispatch":
            raise DispatchError("scripted agent failed to dispatch ([[fail:dispatch]])")
        return self._stream(script, ctx)

    async def _stream(self, script: Script, ctx: RunContext) -> AsyncIterator[str]:
        if script.hang:
            await asyncio.Event().wait()  # never produces output; abort or timeout ends it
        results: list[str] = []
        if script.tools:
            # one step of calls, through the same path as a model's (approval included)
            if ctx.tools is None:
                raise BackendError("the agent's tool settings are not valid", kind="backend")
            calls = [ModelCall(f"call_{i + 1}", name, args) for i, (name, args) in enumerate(script.tools)]
            done = await ctx.tools.run_calls(1, calls, reply_offset=0)
            results = [r.text for r in done]
            if ctx.tools.limit_reached:
                ctx.stop_reason = "tool_limit"
        chunks = 0
        for i, word in enumerate([*reply_words(script, ctx.attachments), *(f" {text}" for text in results)]):
            if i:
                await asyncio.sleep(script.tick_ms / 1000)
            yield word
            chunks += 1
            if script.fail == "stream" and i == 1:
                raise BackendError("scripted agent failed mid-stream ([[fail:stream]])", kind="backend")
        if script.fail == "stream":
            raise BackendError("scripted agent failed mid-stream ([[fail:stream]])", kind="backend")
        # Word counts stand in for token usage, so clients can show it.
        ctx.usage = {"prompt_tokens": len(ctx.message.split()), "completion_tokens": chunks}
