"""An agent's tool settings (TOOLS.md §13.1): their checks, their parsed form, and the names tools go by.

A tool is known by its server's config name and its MCP name (`NAME.tool`); the model knows it by
one function name (`model_name`), and two tools the model would know by one name are refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

SERVER_NAME_RE = re.compile(r"^[a-z0-9_-]{1,32}$")
MODEL_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for function names

LIMIT_DEFAULTS = {
    "max_tool_calls": 16,
    "max_steps": 8,
    "tool_timeout_ms": 60_000,
    "max_tool_result_bytes": 65_536,
    "approval_timeout_ms": 120_000,
}
APPROVAL_MODES = ("never", "always", "unless_read_only")

_STDIO_KEYS = frozenset({"command", "args", "env", "cwd"})
_HTTP_KEYS = frozenset({"url", "headers"})


def model_name(server: str, tool: str) -> str:
    """The OpenAI function name of a server's tool (`NAME__tool`); a bare name for one of no server."""
    return f"{server}__{tool}" if server else tool


@dataclass(frozen=True)
class ToolSpec:
    server: str  # config name, ^[a-z0-9_-]{1,32}$
    tool: str  # the MCP tool name
    description: str
    input_schema: dict[str, Any]
    read_only: bool  # annotations.readOnlyHint is True

    @property
    def qualified(self) -> str:
        return f"{self.server}.{self.tool}"

    @property
    def model_name(self) -> str:
        return model_name(self.server, self.tool)


@dataclass(frozen=True)
class ToolConfig:
    """One agent's tool settings, validated (the limits' defaults: `LIMIT_DEFAULTS`)."""

    servers: dict[str, dict[str, Any]]
    allow: tuple[str, ...] | None  # `NAME.tool` / `NAME.*`; None: every tool of its servers
    approval: dict[str, str]
    max_tool_calls: int
    max_steps: int
    tool_timeout_ms: int
    max_tool_result_bytes: int
    approval_timeout_ms: int

    def allows(self, spec: ToolSpec) -> bool:
        if self.allow is None:
            return True
        return spec.qualified in self.allow or f"{spec.server}.*" in self.allow

    def needs_approval(self, spec: ToolSpec) -> bool:
        """The most specific rule wins: `NAME.tool`, then `NAME.*`, then `*`; default unless_read_only."""
        mode = next(
            (self.approval[k] for k in (spec.qualified, f"{spec.server}.*", "*") if k in self.approval),
            "unless_read_only",
        )
        return mode == "always" or (mode == "unless_read_only" and not spec.read_only)


def tool_config(agent: Mapping[str, Any]) -> ToolConfig:
    """The agent's tool settings (validated by `config_error` first)."""
    allow = agent.get("tools")
    return ToolConfig(
        servers=dict(agent.get("mcp_servers") or {}),
        allow=tuple(allow) if allow is not None else None,
        approval=dict(agent.get("approval") or {}),
        **{key: int(agent.get(key, default)) for key, default in LIMIT_DEFAULTS.items()},
    )


def config_error(agent: Mapping[str, Any]) -> str | None:
    """What is wrong with an agent's tool settings (TOOLS.md §13.1), or None."""
    servers = agent.get("mcp_servers", {})
    problem = validate_servers(servers) if servers else None
    if problem:
        return problem
    allow = agent.get("tools")
    if allow is not None and (not isinstance(allow, list) or not all(isinstance(t, str) and "." in t for t in allow)):
        return "tools must be a list of 'NAME.tool' or 'NAME.*'"
    approval = agent.get("approval", {})
    if not isinstance(approval, dict) or not all(
        isinstance(k, str) and v in APPROVAL_MODES for k, v in approval.items()
    ):
        return "approval must map 'NAME.tool', 'NAME.*' or '*' to one of " + ", ".join(APPROVAL_MODES)
    for key, default in LIMIT_DEFAULTS.items():
        value = agent.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 100_000_000:
            return f"{key} must be a positive integer"
    # the tools named one by one (`NAME.tool`) in the allowlist and the approval rules
    named = [entry.partition(".")[::2] for entry in [*(allow or []), *approval]]
    return name_collision((server, tool) for server, tool in named if server and tool and tool != "*")


# ---------------------------------------------------------------------------------------------
# Names the model would confuse


def name_collision(tools: Iterable[tuple[str, str]]) -> str | None:
    """Two tools the model would know by one function name (`a_` + `b` and `a` + `_b` are both
    `a___b`): a call to that name could not say which one it meant. None when there are none."""
    seen: dict[str, tuple[str, str]] = {}
    for server, tool in tools:
        function = model_name(server, tool)
        first = seen.setdefault(function, (server, tool))
        if first != (server, tool):
            return (
                f"tools '{first[0]}.{first[1]}' and '{server}.{tool}' would both be the model function "
                f"{function!r}; rename one of the servers, or allow only one of the two (tools)"
            )
    return None


def allowed_collision(config: ToolConfig, listed: list[ToolSpec]) -> str | None:
    """Two allowed tools of the servers' lists that share a model function name, or None."""
    return name_collision((s.server, s.tool) for s in listed if config.allows(s))


def name_overlaps(agent: Mapping[str, Any]) -> list[str]:
    """Server names whose tools may share a model function name (`a` and `a_`, or `a` and `a__b`):
    a run is refused only when their listed tools really do (`name_collision`)."""
    servers = agent.get("mcp_servers")
    names = sorted(servers) if isinstance(servers, dict) else []
    found = []
    for short in names:
        for long in names:
            rest = long[len(short) :]
            if long.startswith(short) and (rest == "_" or rest.startswith("__")):
                prefix = (rest + "__")[2:]  # what a tool of `short` must start with to collide
                found.append(
                    f"servers {short!r} and {long!r}: a tool 'T' of {long!r} and a tool '{prefix}T' of "
                    f"{short!r} would both be the model function '{long}__T'"
                )
    return found


# ---------------------------------------------------------------------------------------------
# mcp_servers


def validate_servers(config: Any) -> str | None:
    """The agent's ``mcp_servers`` value checked: an error text naming what is wrong, or None."""
    if not isinstance(config, dict):
        return "mcp_servers must be an object of NAME: {command, args, env, cwd} or NAME: {url, headers}"
    for name, entry in config.items():
        if not isinstance(name, str) or not SERVER_NAME_RE.fullmatch(name):
            return f"mcp_servers: bad server name {name!r} (names match ^[a-z0-9_-]{{1,32}}$)"
        error = validate_server(name, entry)
        if error is not None:
            return error
    return None


def validate_server(name: str, entry: Any) -> str | None:
    """One server's entry checked (`mcp_servers.NAME`): an error text, or None."""
    where = f"mcp_servers.{name}"
    if not isinstance(entry, dict):
        return f"{where} must be an object with either command (stdio) or url (streamable HTTP)"
    unknown = sorted(str(key) for key in entry if key not in _STDIO_KEYS | _HTTP_KEYS)
    if unknown:
        return f"{where}: unknown key(s) {', '.join(unknown)} (allowed: command, args, env, cwd, or url, headers)"
    if ("command" in entry) == ("url" in entry):
        return f"{where} needs exactly one of command (a stdio server) or url (a streamable HTTP server)"
    return _stdio_error(where, entry) if "command" in entry else _http_error(where, entry)


def _stdio_error(where: str, entry: dict[Any, Any]) -> str | None:
    misplaced = sorted(_HTTP_KEYS & entry.keys())
    if misplaced:
        return f"{where}: {', '.join(misplaced)} is for url servers, not command servers"
    command = entry["command"]
    if not isinstance(command, str) or not command.strip() or "\0" in command:
        return f"{where}.command must be a non-empty string"
    args = entry.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) and "\0" not in a for a in args):
        return f"{where}.args must be a list of strings"
    env = entry.get("env", {})
    if not _is_str_map(env) or not all(k and "=" not in k for k in env):
        return f"{where}.env must be an object of strings (names without '=')"
    cwd = entry.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or not cwd or "\0" in cwd):
        return f"{where}.cwd must be a non-empty string"
    return None


def _http_error(where: str, entry: dict[Any, Any]) -> str | None:
    misplaced = sorted(_STDIO_KEYS & entry.keys())
    if misplaced:
        return f"{where}: {', '.join(misplaced)} is for command servers, not url servers"
    url = entry["url"]
    if not isinstance(url, str):
        return f"{where}.url must be a string"
    try:
        parts = urlsplit(url)
        scheme, hostname = parts.scheme, parts.hostname
    except ValueError:  # a malformed URL ("http://[::1")
        scheme, hostname = "", None
    if scheme not in ("http", "https") or not hostname:
        return f"{where}.url must be an http:// or https:// URL, got {url!r}"
    headers = entry.get("headers", {})
    if not _is_str_map(headers) or not all(k and "\n" not in k + v and "\r" not in k + v for k, v in headers.items()):
        return f"{where}.headers must be an object of strings"
    return None


def _is_str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
