"""What the tool tests share: the test MCP server, how a tool-aware client connects, what it saw."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TEST_SERVER = str(Path(__file__).resolve().parent / "mcp_test_server.py")
# the cap and scope a client declares to get tool events and approvals (TOOLS.md §13.3, §13.5)
TOOL_CONNECT = {"caps": ["tool-events"], "scopes": ["operator.read", "operator.write", "operator.approvals"]}


def executions(count_file: Path) -> int:
    """How many times the test server's non-idempotent `count` tool ran (`MCP_COUNT_FILE`)."""
    if not count_file.exists():
        return 0
    return sum(1 for line in count_file.read_text().splitlines() if line.startswith("call"))


def tool_events(client: Any, run_id: str, stream: str = "tool") -> list[dict[str, Any]]:
    """The data of the `agent` events of one stream (`tool`, `approval`) the client got for a run."""
    return [p["data"] for p in client.agent_events(run_id) if p["stream"] == stream]


def results(client: Any, run_id: str) -> list[dict[str, Any]]:
    """The `tool` result events of a run, in the order they came."""
    return [d for d in tool_events(client, run_id) if d["phase"] == "result"]
