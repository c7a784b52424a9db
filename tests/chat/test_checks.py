"""System checks: a configuration the gateway cannot serve fails at start, with the reason."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from chat.checks import agent_table


def test_the_default_agents_pass() -> None:
    assert agent_table() == []


@override_settings(GATEWAY_AGENTS={"main": {"backend": "scripted"}, "gpt-4.1": {"backend": "openai"}})
def test_an_agent_id_the_protocol_refuses_is_an_error() -> None:
    """It was offered by agents.list and then refused on every new chat (INVALID_REQUEST)."""
    (error,) = agent_table()
    assert error.id == "agentgate.E001" and "'gpt-4.1'" in error.msg
    with pytest.raises(SystemCheckError, match=r"agentgate\.E001"):
        call_command("check")


@override_settings(GATEWAY_AGENTS={"main": "scripted"})
def test_an_agent_that_is_not_an_object_is_an_error() -> None:
    (error,) = agent_table()
    assert error.id == "agentgate.E002"


@pytest.mark.parametrize(
    ("tools", "reason"),
    [
        ({"mcp_servers": {"Bad Name": {"command": "x"}}}, "bad server name 'Bad Name'"),
        ({"mcp_servers": {"demo": {"command": "x", "url": "http://h/mcp"}}}, "exactly one of command"),
        ({"mcp_servers": {"demo": {"url": "ftp://h/mcp"}}}, "http:// or https:// URL"),
        ({"tools": "demo.*"}, "tools must be a list"),
        ({"approval": {"demo.*": "sometimes"}}, "approval must map"),
        ({"max_tool_calls": 0}, "max_tool_calls must be a positive integer"),
    ],
    ids=["server-name", "command-and-url", "url-scheme", "allowlist", "approval-mode", "limit"],
)
def test_an_agent_with_bad_tool_settings_is_an_error(settings: Any, tools: dict[str, Any], reason: str) -> None:
    """Caught at start with the reason, instead of as a setup failure on every chat.send (TOOLS.md §13.1)."""
    settings.GATEWAY_AGENTS = {"main": {"backend": "scripted"}, "helper": {"backend": "scripted", **tools}}
    (error,) = agent_table()
    assert error.id == "agentgate.E003" and "'helper'" in error.msg and reason in error.msg, error.msg
    assert "docs/tools.md" in (error.hint or "")
    with pytest.raises(SystemCheckError, match=r"agentgate\.E003"):
        call_command("check")


def test_good_tool_settings_pass(settings: Any) -> None:
    settings.GATEWAY_AGENTS = {
        "main": {
            "backend": "scripted",
            "mcp_servers": {"demo": settings.DEMO_MCP_SERVER, "remote": {"url": "http://127.0.0.1:9/mcp"}},
            "tools": ["demo.*", "remote.search"],
            "approval": {"*": "always", "demo.*": "unless_read_only", "demo.clock": "never"},
            "max_tool_calls": 4,
            "tool_timeout_ms": 5000,
        }
    }
    assert agent_table() == []
