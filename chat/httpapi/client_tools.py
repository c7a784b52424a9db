"""Client function tools beside the agent's own (HTTP-API.md §14.4, §14.8): a name the model would
confuse with one of the agent's tools (`server__tool`) is a 400 that names both and says how out."""

from __future__ import annotations

from chat.base import agents as catalog
from chat.httpapi.errors import bad_request
from chat.runtime.tools.config import config_error, tool_config
from chat.runtime.tools.pool import pool
from chat.runtime.tools.results import ToolServerError
from sessions_app.run_requests import ClientTool


async def check_clash(agent_id: str, tools: list[ClientTool], param: str = "tools") -> None:
    """400 for a client tool named like one of the agent's allowed tools.

    The agent's tools are `server__tool`: only a name starting with one of its servers' names and
    `__` can clash, so the servers' tool lists (cached once listed) are read only then."""
    config = catalog.of(agent_id).config
    servers = config.get("mcp_servers") or {}
    suspects = [(i, t) for i, t in enumerate(tools) if t.name.split("__", 1)[0] in servers and "__" in t.name]
    if not suspects or config_error(config):
        return
    try:
        listed = await pool().list_tools(agent_id, servers)
    except ToolServerError:
        return  # the run's own setup check reports a server that cannot start
    allowed = {spec.model_name: spec for spec in listed if tool_config(config).allows(spec)}
    for i, tool in suspects:
        spec = allowed.get(tool.name)
        if spec is not None:
            raise bad_request(
                f"the client tool {tool.name!r} has the name of agent {agent_id!r}'s own tool {spec.qualified} "
                f"(offered to the model as {spec.model_name!r}): rename the client tool, or leave it out of "
                f"the request's tools (an operator can take {spec.qualified} out of the agent's `tools` allowlist)",
                f"{param}[{i}].function.name",
                "tool_name_clash",
            )
