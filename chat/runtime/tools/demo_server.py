"""The built-in demo MCP server of `make run`'s default agent: a clock, a calculator and notes.

Run it as ``python -m chat.runtime.tools.demo_server`` (stdio) or with ``--http PORT`` (streamable
HTTP on 127.0.0.1). ``add_note`` writes (to ``notes.jsonl`` in ``$AGENTGATE_NOTES_DIR``, by default
``./notes``), so it is not read-only and the gateway asks before running it; the others are.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import operator
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)
WRITES = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)

MAX_EXPRESSION = 500  # characters
MAX_EXPONENT = 1000  # `2 ** 1000` is fine, `9 ** 9 ** 9` is refused
MAX_MAGNITUDE = 10**100  # operands beyond this are refused (keeps `*` and `**` cheap)
MAX_NOTE = 2000  # characters
MAX_NOTES_LISTED = 50

server = MCPServer("agentgate-demo", instructions="A clock, a calculator and a notebook.", log_level="WARNING")

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_evaluate(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ToolError(f"exponent too large (at most {MAX_EXPONENT})")
        try:
            return _checked(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
        except OverflowError:
            raise ToolError("the result is too large") from None
    raise ToolError("only numbers, + - * / // % ** and parentheses are allowed")


def _checked(value: Any) -> int | float:
    if isinstance(value, complex):
        raise ToolError("the result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("the result is not finite")
    if abs(value) > MAX_MAGNITUDE:
        raise ToolError("the result is too large")
    return value  # type: ignore[no-any-return]


@server.tool(annotations=READ_ONLY)
def clock(timezone: str | None = None) -> str:
    """The current date and time, in UTC or in the given IANA timezone (e.g. "Europe/Paris")."""
    try:
        zone = ZoneInfo(timezone) if timezone else UTC
    except (ZoneInfoNotFoundError, ValueError):
        raise ToolError(f"unknown timezone {timezone!r}") from None
    now = datetime.now(zone)
    return f"{now.isoformat(timespec='seconds')} ({now:%A}, {timezone or 'UTC'})"


@server.tool(annotations=READ_ONLY)
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses."""
    if len(expression) > MAX_EXPRESSION:
        raise ToolError(f"expression too long (at most {MAX_EXPRESSION} characters)")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ToolError("not an arithmetic expression") from None
    return f"{expression.strip()} = {_evaluate(tree)}"


def _notes_file() -> Path:
    return Path(os.environ.get("AGENTGATE_NOTES_DIR") or Path.cwd() / "notes") / "notes.jsonl"


@server.tool(annotations=WRITES)
def add_note(text: str) -> str:
    """Save a short note to the notebook."""
    text = text.strip()
    if not text:
        raise ToolError("the note is empty")
    if len(text) > MAX_NOTE:
        raise ToolError(f"the note is too long (at most {MAX_NOTE} characters)")
    path = _notes_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {"at": datetime.now(UTC).isoformat(timespec="seconds"), "text": text}
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(entry, ensure_ascii=False) + "\n")
    return f"Saved note: {text}"


@server.tool(annotations=READ_ONLY)
def list_notes() -> str:
    """The notes saved so far, newest last."""
    try:
        lines = _notes_file().read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return "No notes yet."
    notes = []
    for line in lines[-MAX_NOTES_LISTED:]:
        try:
            entry = json.loads(line)
            notes.append(f"- {entry['at']}: {entry['text']}")
        except (ValueError, KeyError, TypeError):
            continue
    return "\n".join(notes) if notes else "No notes yet."


def serve(mcp_server: MCPServer, description: str | None, argv: list[str] | None = None) -> None:
    """Run an MCP server from the command line: stdio, or `--http PORT` for streamable HTTP on loopback."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on 127.0.0.1:PORT")
    args = parser.parse_args(argv)
    if args.http is not None:
        mcp_server.run("streamable-http", host="127.0.0.1", port=args.http)
    else:
        mcp_server.run()


def main(argv: list[str] | None = None) -> None:
    serve(server, __doc__.splitlines()[0] if __doc__ else None, argv)


if __name__ == "__main__":
    main()
