"""The `scripted` demo and test agent (PROTOCOL.md §11)."""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from chat.runtime.backends.base import AgentBackend, BackendError, DispatchError, RunContext
from chat.runtime.tools.host import ModelCall

DIRECTIVE_RE = re.compile(r"\[\[(delay|tick|words|fail|hang|verbatim|request)(?::([A-Za-z0-9]+))?\]\]")
# [[tool:NAME.tool {"json": "args"}]] (TOOLS.md §13.8): the arguments end at the first `}]]`
TOOL_RE = re.compile(r"\[\[tool:([A-Za-z0-9_.-]{1,200})(?:\s+(\{.*?\}))?\]\]", re.DOTALL)
# [[client_tool:NAME {"json": "args"}]]: a call of the HTTP request's own function tool NAME (HTTP-API.md §14.4)
CLIENT_TOOL_RE = re.compile(r"\[\[client_tool:([A-Za-z0-9_-]{1,64})(?:\s+(\{.*?\}))?\]\]", re.DOTALL)
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
    client_tools: list[tuple[str, str]] = field(default_factory=list)  # [[client_tool:...]]: (NAME, arguments)
    request: bool = False  # [[request]]: the reply is a summary of what the run received


def parse_script(message: str) -> Script:
    """Split directives out of `message`; what is left (whitespace folded) is the text."""
    script = Script(text="")
    script.tools = [(name, args or "{}") for name, args in TOOL_RE.findall(message)[:MAX_TOOL_DIRECTIVES]]
    message = TOOL_RE.sub(" ", message)
    script.client_tools = [(n, args or "{}") for n, args in CLIENT_TOOL_RE.findall(message)[:MAX_TOOL_DIRECTIVES]]
    message = CLIENT_TOOL_RE.sub(" ", message)
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
        elif name == "request":
            script.request = True
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
    return _within_budget(_chunks(script, attachments))


def _within_budget(chunks: Iterable[str]) -> Iterator[str]:
    budget = MAX_REPLY_CHARS
    for chunk in chunks:
        if len(chunk) > budget:
            return
        budget -= len(chunk)
        yield chunk


def request_summary(ctx: RunContext) -> str:
    """`[[request]]`: what the run received of its HTTP request, as one line of JSON (the HTTP API's tests read it)."""
    request = ctx.request
    return json.dumps(
        {
            "instructionCount": len(request.instructions),
            "instructions": request.instructions,
            "contextCount": len(request.context),
            "stateless": ctx.stateless,
            "params": request.params,
            "clientTools": [tool.name for tool in request.client_tools],
            "toolChoice": request.tool_choice,
            "toolResults": [result.call_id for result in request.tool_results],
            "model": ctx.model,
            "reasoningEffort": ctx.thinking_level,
            "user": request.user,
            "metadata": request.metadata,
        },
        separators=(",", ":"),
    )


def _result_echoes(ctx: RunContext) -> Iterator[str]:
    """` tool NAME returned OUTPUT` for each result the request brought, `;` between them. NAME is the
    function the call named (its call id when the call is not known)."""
    names = {c[key]: c["name"] for c in ctx.answered_calls for key in ("id", "model_id") if c.get(key)}
    for message in ctx.request.context:  # a stateless request carries its calls itself
        for call in message.get("tool_calls") or []:
            if isinstance(call, dict) and call.get("id"):
                names.setdefault(str(call["id"]), str((call.get("function") or {}).get("name") or ""))
    for i, result in enumerate(ctx.request.tool_results):
        name = names.get(result.call_id) or result.call_id
        yield f"{';' if i else ''} tool {name} returned {result.output}"


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
    """Replies `echo: <text>` word by word; directives drive delays, failures, tool calls (its own and an
    HTTP request's client tools) and a summary of what an HTTP request brought."""

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
        offered = {tool.name for tool in ctx.request.client_tools}
        handed = [(name, args) for name, args in script.client_tools if name in offered]
        refused = [
            f" (client tool {name} was not offered)" for name, _args in script.client_tools if name not in offered
        ]
        if script.request:
            words: Iterable[str] = [request_summary(ctx)]
        else:
            words = _within_budget(
                [*_chunks(script, ctx.attachments), *(f" {text}" for text in results), *_result_echoes(ctx), *refused]
            )
        # Word i is due i ticks after the first, however long the gateway took to read the ones
        # before: a model's stream keeps its pace whatever its reader's load, and a reader that
        # comes late finds what was written meanwhile in one read. So words come one a chunk while
        # the gateway keeps up, and those already due together in one chunk when it does not.
        said = length = 0  # words, characters
        loop = asyncio.get_running_loop()
        tick = script.tick_ms / 1000
        began = loop.time()
        held = ""  # words due, not handed over yet
        for i, word in enumerate(words):
            if i:
                wait = began + i * tick - loop.time()
                if wait > 0 or not tick:
                    yield held
                    held = ""
                    await asyncio.sleep(max(0.0, wait))
            held += word
            said, length = said + 1, length + len(word)
            if script.fail == "stream" and i == 1:
                yield held
                raise BackendError("scripted agent failed mid-stream ([[fail:stream]])", kind="backend")
        if held:
            yield held
        if script.fail == "stream":
            raise BackendError("scripted agent failed mid-stream ([[fail:stream]])", kind="backend")
        if handed:
            # after the text, as a model's step writes its text before its calls; the run then ends
            if ctx.tools is None:
                raise BackendError("the agent's tool settings are not valid", kind="backend")
            calls = [ModelCall(f"call_{secrets.token_hex(6)}", name, args) for name, args in handed]
            await ctx.tools.hand_to_client(2 if script.tools else 1, calls, reply_offset=length)
            ctx.stop_reason = "tool_calls"
        # Word counts stand in for token usage, so clients can show it.
        ctx.usage = {"prompt_tokens": len(ctx.message.split()), "completion_tokens": said}
