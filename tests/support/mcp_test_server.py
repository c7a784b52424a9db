"""An MCP server for the gateway's tests: stdio by default, ``--http PORT`` for streamable HTTP on 127.0.0.1.

``MCP_COUNT_FILE`` (env) names a file the server appends to, so a test can see what ran: one line
``call <arg>`` per ``count``, and ``cancelled`` whenever ``slow`` was cancelled. ``MCP_EXTRA_TOOLS``
(env, comma-separated) names more tools that echo, listed from the start (odd names such as ``_echo``).
"""

from __future__ import annotations

import os
import time

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from chat.runtime.tools.demo_server import serve

READ_ONLY = ToolAnnotations(read_only_hint=True)
WRITES = ToolAnnotations(read_only_hint=False, idempotent_hint=False)

server = MCPServer("agentgate-test", log_level="WARNING")


def _append(line: str) -> None:
    path = os.environ.get("MCP_COUNT_FILE")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def _calls() -> int:
    path = os.environ.get("MCP_COUNT_FILE")
    with open(path or os.devnull, encoding="utf-8") as f:
        return sum(1 for line in f if line.startswith("call"))


@server.tool(annotations=WRITES)
async def count(arg: str = "", ms: int = 0) -> str:
    """Record one call (not idempotent), then sleep ms milliseconds; return how many calls were recorded so far."""
    _append(f"call {arg}")
    if ms:
        await anyio.sleep(ms / 1000)
    return str(_calls())


@server.tool(annotations=READ_ONLY)
def echo(text: str) -> str:
    """Return the text."""
    return text


@server.tool(annotations=READ_ONLY)
async def slow(ms: int) -> str:
    """Sleep for ms milliseconds; a cancellation stops it (and is recorded)."""
    try:
        await anyio.sleep(ms / 1000)
    except anyio.get_cancelled_exc_class():
        _append("cancelled")
        raise
    return f"slept {ms} ms"


@server.tool(annotations=READ_ONLY)
async def stubborn(ms: int) -> str:
    """Sleep for ms milliseconds, blocking the server's event loop: it can neither see a cancellation nor answer."""
    time.sleep(ms / 1000)  # noqa: ASYNC251 - the point of this tool
    return f"slept {ms} ms"


@server.tool(annotations=READ_ONLY)
def big(n: int) -> str:
    """Return n bytes of text."""
    return "x" * n


@server.tool(annotations=READ_ONLY)
async def progress_flood(n: int, ctx: Context) -> str:
    """Send n progress notifications as fast as possible, then return "done"."""
    for i in range(n):
        await ctx.report_progress(i + 1, n, f"step {i + 1}")
    return "done"


@server.tool(annotations=READ_ONLY)
def fail(message: str = "it failed") -> str:
    """Return an error result (isError) with the message."""
    raise ToolError(message)


@server.tool(annotations=READ_ONLY)
def crash() -> str:
    """Exit the server process at once (code 3)."""
    os._exit(3)


@server.tool(annotations=READ_ONLY)
def pid() -> str:
    """The server's process id."""
    return str(os.getpid())


@server.tool(annotations=WRITES)
async def grow(name: str, ctx: Context) -> str:
    """Add a tool called `name` (it echoes) and announce that the tool list changed."""

    def added(text: str) -> str:
        return text

    server.add_tool(added, name=name, description="Added at run time.", annotations=READ_ONLY)
    await ctx.notify_tools_changed()  # 2026-07-28 clients: the subscriptions/listen stream
    if ctx.protocol_version is not None and ctx.protocol_version < "2026":
        await ctx.session.send_tool_list_changed()  # earlier clients: a plain notification
    return f"added {name}"


def main() -> None:
    for name in filter(None, os.environ.get("MCP_EXTRA_TOOLS", "").split(",")):
        server.add_tool(echo, name=name, description="Echoes (MCP_EXTRA_TOOLS).", annotations=READ_ONLY)
    serve(server, __doc__.splitlines()[0] if __doc__ else None)


if __name__ == "__main__":
    main()
