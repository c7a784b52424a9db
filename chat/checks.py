"""System checks of the gateway's configuration (run by `manage.py serve`, `migrate`, `check`)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

from chat.base import agents as catalog
from chat.protocol.keys import AGENT_ID_RE
from chat.runtime.tools.config import config_error, name_overlaps


@checks.register()
def agent_table(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every configured agent can be named: an id the protocol refuses would be offered by
    `agents.list` and then refused on every new chat (`agent:<id>:<name>` keys); and its tool
    settings are valid (TOOLS.md §13.1), else every chat.send to it fails before its ack; a warning
    names its servers whose tools may share a model function name (only their lists can tell)."""
    errors: list[checks.CheckMessage] = []
    for agent_id, config in settings.GATEWAY_AGENTS.items():
        if not isinstance(agent_id, str) or not AGENT_ID_RE.fullmatch(agent_id):
            errors.append(
                checks.Error(
                    f"GATEWAY_AGENTS: agent id {agent_id!r} is not allowed",
                    hint=f"agent ids match {AGENT_ID_RE.pattern} (letters, digits, '_' and '-'); "
                    'name the agent apart from its model, e.g. \'gpt41\': {"model": "gpt-4.1", ...}',
                    id="agentgate.E001",
                )
            )
        elif not isinstance(config, dict):
            errors.append(
                checks.Error(
                    f"GATEWAY_AGENTS: agent {agent_id!r} must be an object (its backend, model, ...)",
                    hint='e.g. {"backend": "openai", "model": "gpt-4.1"}',
                    id="agentgate.E002",
                )
            )
        else:
            models_problem = catalog.models_error(config)
            if models_problem:
                # the models a session may choose (docs/agents.md): offered by models.list, checked by sends
                errors.append(
                    checks.Error(
                        f"GATEWAY_AGENTS: agent {agent_id!r} has a bad models list: {models_problem}",
                        hint='models is a list of model names next to model, e.g. "models": ["gpt-4.1-mini"]',
                        id="agentgate.E004",
                    )
                )
            thinking_problem = catalog.thinking_error(config)
            if thinking_problem:
                # its sessions' default level, shown to clients as `thinkingDefault`
                errors.append(
                    checks.Error(
                        f"GATEWAY_AGENTS: agent {agent_id!r} has a bad thinking level: {thinking_problem}",
                        hint='e.g. "thinking": "low"; leave it out for "off"',
                        id="agentgate.E005",
                    )
                )
            problem = config_error(config)
            if problem:
                # the same check a chat.send makes before its ack: caught at start instead of on every send
                errors.append(
                    checks.Error(
                        f"GATEWAY_AGENTS: agent {agent_id!r} has bad tool settings: {problem}",
                        hint="see docs/tools.md for every key (mcp_servers, tools, approval and the limits) "
                        "and its default",
                        id="agentgate.E003",
                    )
                )
            else:
                # only the servers' lists can tell: a chat.send is refused when two listed tools collide
                errors.extend(
                    checks.Warning(
                        f"GATEWAY_AGENTS: agent {agent_id!r} has tool names that may collide: {overlap}",
                        hint="a chat.send to it fails before its ack if its servers list two such tools; "
                        "rename one of the servers (docs/tools.md)",
                        id="agentgate.W001",
                    )
                    for overlap in name_overlaps(config)
                )
    return errors
