"""The `scripted` demo and test agent (PROTOCOL.md §11)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from .base import AgentBackend, BackendError, DispatchError, RunContext

DIRECTIVE_RE = re.compile(r"\[\[(delay|tick|words|fail|hang|verbatim)(?::([A-Za-z0-9]+))?\]\]")


@dataclass
class Script:
    text: str
    delay_ms: int = 0
    tick_ms: int = 20
    words: int | None = None
    fail: str | None = None
    hang: bool = False
    verbatim: bool = False  # keep the text's line breaks and spacing (Markdown demos)


def parse_script(message: str) -> Script:
    """Split directives out of `message`; what is left (whitespace folded) is the text."""
    script = Script(text="")
    for name, arg in DIRECTIVE_RE.findall(message):
        if name == "delay" and arg.isdigit():
            script.delay_ms = int(arg)
        elif name == "tick" and arg.isdigit():
            script.tick_ms = int(arg)
        elif name == "words" and arg.isdigit():
            script.words = int(arg)
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


def reply_words(script: Script, attachments: list[dict[str, Any]]) -> list[str]:
    """The reply `echo: <text>` as the chunks streamed, one word each.

    With `[[verbatim]]` the reply is `echo:`, a blank line, then the text exactly as sent
    (each chunk a word with the whitespace before it), so Markdown in it stays Markdown.
    """
    if script.verbatim and script.words is None:
        return ["echo:\n\n", *re.findall(r"\s*\S+", script.text)]
    body = [f"word{i + 1}" for i in range(script.words)] if script.words is not None else script.text.split()
    if attachments:
        body.append(f"(+{len(attachments)} attachment{'s' if len(attachments) > 1 else ''})")
    return ["echo:"] + [f" {w}" for w in body]


class ScriptedBackend(AgentBackend):
    """Replies `echo: <text>` word by word; directives drive delays and failures."""

    def check_setup(self, message: str, attachments: list[dict[str, Any]]) -> str | None:
        if parse_script(message).fail == "setup":
            return "scripted agent refused the run during setup ([[fail:setup]])"
        return None

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
        chunks = reply_words(script, ctx.attachments)
        for i, word in enumerate(chunks):
            if i:
                await asyncio.sleep(script.tick_ms / 1000)
            yield word
            if script.fail == "stream" and i == 1:
                raise BackendError("scripted agent failed mid-stream ([[fail:stream]])", kind="backend")
        if script.fail == "stream":
            raise BackendError("scripted agent failed mid-stream ([[fail:stream]])", kind="backend")
        # Word counts stand in for token usage, so clients can show it.
        ctx.usage = {"prompt_tokens": len(ctx.message.split()), "completion_tokens": len(chunks)}
