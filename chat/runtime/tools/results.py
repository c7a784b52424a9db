"""What an MCP server sends back, bounded and made text: listed tools, results, progress, errors.

What a server can do to us is bounded: progress reaches ``on_progress`` at most 10 times a second
(the rest is dropped, never queued), and a result over 8 MiB of text is refused; what the model
is told of a result is capped further, at the agent's ``max_tool_result_bytes`` (`cap_result`).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import mcp.types as mcp_types
from mcp.shared.exceptions import MCPError

from chat.runtime.tools.config import MODEL_NAME_RE, ToolSpec

logger = logging.getLogger(__name__)

PROGRESS_INTERVAL_S = 0.1  # on_progress at most 10 times a second
MAX_PROGRESS_MESSAGE = 1000  # characters of a progress message passed on
MAX_RESULT_BYTES = 8 * 1024 * 1024

ProgressCallback = Callable[[float, float | None, str | None], Awaitable[None]]


@dataclass(frozen=True)
class ToolOutcome:
    text: str  # text blocks joined with "\n"; other blocks described; structured content as JSON if no text
    is_error: bool  # CallToolResult.is_error


class ToolServerError(Exception):
    """The server is missing, could not start, crashed, or answered garbage."""

    def __init__(self, message: str, kind: str = "tool_server") -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind


def listed_spec(server: str, tool: mcp_types.Tool) -> ToolSpec | None:
    """A tool of a server's list, or None (logged) when the model could not call it by name."""
    spec = ToolSpec(
        server=server,
        tool=tool.name,
        description=tool.description or tool.title or "",
        input_schema=dict(tool.input_schema) if tool.input_schema else {"type": "object", "properties": {}},
        read_only=tool.annotations is not None and tool.annotations.read_only_hint is True,
    )
    if not MODEL_NAME_RE.fullmatch(spec.model_name):
        logger.warning("MCP server %r: tool %r skipped, its name cannot be a model function name", server, tool.name)
        return None
    return spec


def outcome(server: str, tool: str, result: mcp_types.CallToolResult) -> ToolOutcome:
    """A call's result as text; raises ToolServerError when that is over MAX_RESULT_BYTES."""
    text = _render(result)
    if _too_big(text):
        limit = f"{MAX_RESULT_BYTES / 1024 / 1024:g} MiB"
        raise ToolServerError(f"MCP server {server!r} answered {tool!r} with too much text (over {limit})")
    return ToolOutcome(text=text, is_error=bool(result.is_error))


def _render(result: mcp_types.CallToolResult) -> str:
    parts: list[str] = []
    has_text = False
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
            has_text = True
        elif isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
            parts.append(f"[{block.type} {block.mime_type}, {_b64_size(block.data)} bytes]")
        elif isinstance(block, mcp_types.ResourceLink):
            parts.append(f"[resource link {block.uri}]")
        elif isinstance(block, mcp_types.EmbeddedResource):
            resource = block.resource
            if isinstance(resource, mcp_types.TextResourceContents):
                parts.append(f"[resource {resource.uri}]\n{resource.text}")
                has_text = True
            else:
                size = _b64_size(resource.blob)
                parts.append(f"[resource {resource.uri}, {resource.mime_type or 'binary'}, {size} bytes]")
        else:
            parts.append(f"[{getattr(block, 'type', 'unknown')} content]")
    if result.structured_content is not None and not has_text:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


def _b64_size(data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=False))
    except (binascii.Error, ValueError):
        return len(data) * 3 // 4


def _too_big(text: str) -> bool:
    return len(text) > MAX_RESULT_BYTES or (len(text) * 4 > MAX_RESULT_BYTES and len(text.encode()) > MAX_RESULT_BYTES)


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


def describe(exc: BaseException) -> str:
    """One line for an exception, looking inside single-member exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        return f"{exc.message} (MCP error {exc.code})"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


class ProgressGate:
    """Passes progress on at most every PROGRESS_INTERVAL_S, and never two at once; drops the rest."""

    def __init__(self, deliver: ProgressCallback) -> None:
        self._deliver = deliver
        self._last = float("-inf")
        self._busy = False
        self.closed = False

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        if self.closed or self._busy:
            return
        now = time.monotonic()
        if now - self._last < PROGRESS_INTERVAL_S:
            return
        self._last = now
        self._busy = True
        try:
            await self._deliver(progress, total, message[:MAX_PROGRESS_MESSAGE] if message else message)
        except Exception:
            logger.exception("on_progress raised")
        finally:
            self._busy = False
