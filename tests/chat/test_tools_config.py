"""An agent's `mcp_servers` checked (chat/runtime/tools/config.py)."""

from __future__ import annotations

from typing import Any

from chat.runtime.tools.config import validate_servers


def test_validate_servers() -> None:
    assert validate_servers({}) is None
    assert validate_servers({"t": {"command": "x", "args": ["-v"], "env": {"A": "1"}, "cwd": "/tmp"}}) is None
    assert validate_servers({"web-1": {"url": "https://example.com/mcp", "headers": {"Authorization": "x"}}}) is None

    def error(config: Any) -> str:
        message = validate_servers(config)
        assert message is not None, config
        return message

    assert "object" in error(["t"])
    assert "Bad" in error({"Bad": {"command": "x"}})
    assert "bad server name" in error({"x" * 33: {"command": "x"}})
    assert "timeout" in error({"t": {"command": "x", "timeout": 3}})
    assert "exactly one" in error({"t": {"command": "x", "url": "http://h/mcp"}})
    assert "exactly one" in error({"t": {}})
    assert "object" in error({"t": "python server.py"})
    assert "command" in error({"t": {"command": ""}})
    assert "args" in error({"t": {"command": "x", "args": "-v"}})
    assert "args" in error({"t": {"command": "x", "args": [1]}})
    assert "env" in error({"t": {"command": "x", "env": {"A": 1}}})
    assert "cwd" in error({"t": {"command": "x", "cwd": 7}})
    assert "headers" in error({"t": {"command": "x", "headers": {}}})
    assert "url" in error({"t": {"url": "ftp://h/mcp"}})
    assert "url" in error({"t": {"url": 5}})
    assert "headers" in error({"t": {"url": "http://h/mcp", "headers": {"A": 1}}})
    assert "env" in error({"t": {"url": "http://h/mcp", "env": {}}})


def test_a_malformed_server_url_is_refused_with_a_reason() -> None:
    error = validate_servers({"t": {"url": "http://[::1/mcp"}})
    assert error is not None and "http:// or https:// URL" in error
