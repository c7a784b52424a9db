"""System checks: a configuration the gateway cannot serve fails at start, with the reason."""

from __future__ import annotations

from typing import Any

import pytest
from django.core import checks
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
        (
            {"mcp_servers": {"a": {"command": "x"}, "a_": {"command": "x"}}, "tools": ["a_.b", "a._b"]},
            "tools 'a_.b' and 'a._b' would both be the model function 'a___b'",
        ),
        (
            {"tools": ["a.*", "a__b.*"], "approval": {"a.b__c": "never", "a__b.c": "always"}},
            "tools 'a.b__c' and 'a__b.c' would both be the model function 'a__b__c'",
        ),
    ],
    ids=[
        "server-name",
        "command-and-url",
        "url-scheme",
        "allowlist",
        "approval-mode",
        "limit",
        "colliding-allowlist",
        "colliding-approval-rules",
    ],
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


@pytest.mark.parametrize(
    ("servers", "overlap"),
    [
        (["a", "a_"], "a tool 'T' of 'a_' and a tool '_T' of 'a' would both be the model function 'a___T'"),
        (["a__b", "a"], "a tool 'T' of 'a__b' and a tool 'b__T' of 'a' would both be the model function 'a__b__T'"),
    ],
    ids=["trailing-underscore", "double-underscore"],
)
def test_server_names_whose_tools_may_collide_are_a_warning(settings: Any, servers: list[str], overlap: str) -> None:
    """Only the servers' lists can tell whether two tools collide (a chat.send then fails before its
    ack): the check says which servers and which tool names, and does not stop the gateway."""
    config = {"backend": "scripted", "mcp_servers": {name: {"command": "x"} for name in servers}}
    settings.GATEWAY_AGENTS = {"helper": config}
    (warning,) = agent_table()
    assert warning.id == "agentgate.W001" and warning.level == checks.WARNING
    assert "'helper'" in warning.msg and overlap in warning.msg, warning.msg
    call_command("check")  # a warning: the gateway still starts


def test_server_names_that_cannot_collide_pass(settings: Any) -> None:
    names = ["a", "ab", "a-b", "a_b", "b_", "a_b_c"]
    settings.GATEWAY_AGENTS = {"main": {"backend": "scripted", "mcp_servers": {n: {"command": "x"} for n in names}}}
    assert agent_table() == []
