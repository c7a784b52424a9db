"""The configured agents and their models: `agents.list`, `models.list`, `agent.identity.get`,
`models.authStatus`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chat.base import agents as catalog
from chat.methods.registry import Conn, Reply, method
from chat.methods.session_settings import thinking_levels
from chat.protocol.frames import now_ms
from chat.protocol.keys import MAIN_KEY, named_session, optional_agent, session_key_param
from chat.protocol.scopes import Scope

# OpenClaw's session scope: each user has their own sessions (and their own `main`).
SESSION_SCOPE = "per-sender"


def agent_entries(configured: Sequence[catalog.Agent]) -> list[dict[str, Any]]:
    """The agents a client may choose: id, display name, model (OpenClaw's `{primary}`), backend.

    Nothing else of their config (keys, URLs) is sent.
    """
    return [
        {
            "id": agent.id,
            "name": agent.name,
            "model": {"primary": agent.model} if agent.model else {},
            "backend": agent.backend,
        }
        for agent in configured
    ]


def agents_answer(configured: Sequence[catalog.Agent]) -> dict[str, Any]:
    """`agents.list`: the agents, the default one, and how sessions are keyed (as OpenClaw says it)."""
    return {
        "agents": agent_entries(configured),
        "defaultId": catalog.DEFAULT_AGENT,
        "mainKey": MAIN_KEY,
        "scope": SESSION_SCOPE,
    }


def model_choices(agent_ids: Sequence[str]) -> dict[str, Any]:
    """`models.list` in OpenClaw's shape: the models sessions of these agents may choose, each once."""
    models: list[dict[str, Any]] = []
    seen: set[tuple[str | None, str]] = set()
    for agent_id in agent_ids:
        agent = catalog.of(agent_id)
        for model in agent.models:
            if (agent.provider, model) in seen:
                continue
            seen.add((agent.provider, model))
            choice: dict[str, Any] = {"id": model, "name": model, "provider": agent.provider}
            if agent.context_tokens is not None:
                choice["contextTokens"] = agent.context_tokens
            choice["thinkingLevels"] = thinking_levels()
            models.append(choice)
    return {"models": models}


def identity_answer(agent_id: str) -> dict[str, Any]:
    """`agent.identity.get`: the agent's display name (its configured `name`, else its id)."""
    named = catalog.of(agent_id).config.get("name")
    if isinstance(named, str) and named.strip():
        return {"agentId": agent_id, "name": named.strip(), "nameSource": "config"}
    return {"agentId": agent_id, "name": agent_id, "nameSource": "default"}


def parse_models_list(params: dict[str, Any]) -> list[str]:
    """`models.list {agentId?, sessionKey?}`: the agents whose models to list — the one named (by
    `agentId`, or by a session's key), else every configured agent. OpenClaw's other params
    (`includeDetails`, `view`, ...) are ignored: there is no catalog beyond the configured models."""
    agent_id = optional_agent(params)
    if agent_id is not None:
        return [agent_id]
    if params.get("sessionKey") is not None or params.get("key") is not None:
        return [session_key_param(params)[1]]
    return catalog.ids()


def parse_identity(params: dict[str, Any]) -> str:
    """`agent.identity.get {agentId?, sessionKey?}`: the agent asked about (`main` by default)."""
    if params.get("sessionKey") is not None or params.get("key") is not None:
        _key, agent_id = named_session(params)
        return agent_id
    return optional_agent(params) or catalog.DEFAULT_AGENT


@method("agents.list", scope=Scope.READ)
async def agents_list(conn: Conn, params: dict[str, Any]) -> Reply:
    """The configured agents (id, display name, model, backend), for a client's agent picker."""
    return Reply(agents_answer(list(catalog.all_agents().values())))


@method("models.list", scope=Scope.READ)
async def models_list(conn: Conn, params: dict[str, Any]) -> Reply:
    """The models a session may choose (OpenClaw's `/model` picker): one agent's, or every agent's."""
    return Reply(model_choices(parse_models_list(params)))


@method("agent.identity.get", scope=Scope.READ)
async def agent_identity(conn: Conn, params: dict[str, Any]) -> Reply:
    return Reply(identity_answer(parse_identity(params)))


@method("models.authStatus", scope=Scope.READ)
async def models_auth_status(conn: Conn, params: dict[str, Any]) -> Reply:
    """No provider here signs in through a client: credentials are the operator's configuration."""
    parse_identity(params)
    return Reply({"ts": now_ms(), "providers": []})
