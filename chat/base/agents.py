"""The configured agents (`GATEWAY_AGENTS`), built once into typed configs (docs/agents.md).

Every room reads the agents here: which exist, their backend and display name, the models a
session may choose, the model and thinking level a session runs with, their provider and context
budget. The table is built from the settings once and again only when they change (tests swap and
edit `GATEWAY_AGENTS`); a backend or the tool host parses its own part of an agent's `config`.
The raw settings are validated by the system checks (`chat.checks`), which use the validators here.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from django.conf import settings

# OpenClaw's thinking levels this gateway can honour (an `openai` agent sends each but `off` as the
# request's reasoning_effort, docs/agents.md), in OpenClaw's order.
THINKING_LEVELS = ("off", "minimal", "low", "medium", "high", "xhigh", "max")
# A session that chose no level runs with its agent's `thinking`, else this (OpenClaw's default).
DEFAULT_THINKING = "off"
DEFAULT_AGENT = "main"  # the agent a bare session key names


@dataclass(frozen=True)
class Agent:
    """One configured agent, as every room reads it."""

    id: str
    config: Mapping[str, Any]  # its settings as configured (read-only): backends and tools parse their parts
    backend: str  # "scripted", "openai"; "" for an agent that is not configured
    name: str  # its display name (its `name`, else its id)
    model: str  # its own model ("" when it has none)
    models: tuple[str, ...]  # the models a session may use: its `model` first, then its `models`
    thinking_default: str  # the level a session that chose none runs with
    context_tokens: int | None  # its context budget (`context_tokens`), when configured as a number

    @property
    def configured(self) -> bool:
        return bool(self.backend)

    @property
    def provider(self) -> str | None:
        """Who serves its models, as OpenClaw names a model's provider: its backend (None when not configured)."""
        return self.backend or None


def _models(config: Mapping[str, Any]) -> tuple[str, ...]:
    """Its `model`, then its `models`; entries that are not non-empty strings are left out
    (`models_error` reports them)."""
    listed = config.get("models")
    names = [config.get("model"), *(listed if isinstance(listed, list) else [])]
    found: list[str] = []
    for name in names:
        if isinstance(name, str) and name.strip() and name.strip() not in found:
            found.append(name.strip())
    return tuple(found)


def _context_tokens(config: Mapping[str, Any]) -> int | None:
    value = config.get("context_tokens")
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 1:
        return None
    return int(value)


def build(agent_id: str, config: Mapping[str, Any]) -> Agent:
    """The typed agent of one entry of `GATEWAY_AGENTS` (an entry that is not an object is not configured)."""
    if not isinstance(config, Mapping):
        return missing(agent_id)
    frozen = MappingProxyType(copy.deepcopy(dict(config)))
    model = config.get("model")
    name = config.get("name")
    level = config.get("thinking")
    return Agent(
        id=agent_id,
        config=frozen,
        backend=str(config.get("backend") or "scripted"),
        name=name.strip() if isinstance(name, str) and name.strip() else agent_id,
        model=model.strip() if isinstance(model, str) else "",
        models=_models(config),
        thinking_default=level if level in THINKING_LEVELS else DEFAULT_THINKING,
        context_tokens=_context_tokens(config),
    )


def missing(agent_id: str) -> Agent:
    """An agent that is not configured (any more): no backend, no models."""
    return Agent(agent_id, MappingProxyType({}), "", agent_id, "", (), DEFAULT_THINKING, None)


class _Table:
    """The typed table, built again only when the settings' value changes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.source: dict[str, Any] | None = None  # a deep copy of the settings it was built from
        self.agents: dict[str, Agent] = {}

    def current(self) -> dict[str, Agent]:
        configured = settings.GATEWAY_AGENTS
        if self.source is not None and self.source == configured:
            return self.agents
        with self.lock:
            if self.source is None or self.source != configured:
                agents = {str(agent_id): build(str(agent_id), config) for agent_id, config in configured.items()}
                self.agents, self.source = agents, copy.deepcopy(dict(configured))
            return self.agents


_table = _Table()


def all_agents() -> dict[str, Agent]:
    """Every configured agent, in their configured order."""
    return _table.current()


def ids() -> list[str]:
    return list(all_agents())


def get(agent_id: str) -> Agent | None:
    """The configured agent, or None."""
    return all_agents().get(agent_id)


def of(agent_id: str) -> Agent:
    """The agent, or an unconfigured one (no models) when it is not configured (any more)."""
    return all_agents().get(agent_id) or missing(agent_id)


def known(agent_id: str) -> bool:
    return agent_id in all_agents()


def provider_of(agent_id: str) -> str | None:
    return of(agent_id).provider


def session_model(agent: Agent, override: str) -> str:
    """THE model a session of this agent runs with: its override while the agent still allows it,
    else the agent's own (an override the operator has since removed from `models` is ignored)."""
    return override if override and override in agent.models else agent.model


def session_thinking(agent: Agent, level: str) -> str:
    """THE thinking level a session runs with: its own, else its agent's default."""
    return level or agent.thinking_default


def resolve_model(agent_id: str, name: str) -> str | None:
    """The allowed model `name` means for this agent, or None: an id as listed, or `provider/id` as
    OpenClaw's model picker sends it (`openai/gpt-4o-mini`)."""
    agent = of(agent_id)
    if name in agent.models:
        return name
    prefix = f"{agent.provider}/"
    if agent.provider is not None and name.startswith(prefix) and name[len(prefix) :] in agent.models:
        return name[len(prefix) :]
    return None


# --- validators of the raw settings (the system checks; the openai backend's setup check) -------------


def models_error(config: Mapping[str, Any]) -> str | None:
    """What is wrong with the agent's `models` list, or None."""
    listed = config.get("models", [])
    if not isinstance(listed, list) or not all(isinstance(m, str) and m.strip() for m in listed):
        return "models must be a list of model names"
    return None


def thinking_error(config: Mapping[str, Any]) -> str | None:
    """What is wrong with the agent's `thinking` (its sessions' default level), or None."""
    level = config.get("thinking")
    if level is not None and level not in THINKING_LEVELS:
        return f"thinking must be one of {', '.join(THINKING_LEVELS)}"
    return None
