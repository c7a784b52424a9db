"""The configured agents (`GATEWAY_AGENTS`) as sessions see them: the models a session may choose,
the model and thinking level a session runs with, its provider and its context budget
(docs/agents.md).

A leaf module (Django settings only), so the protocol (validating a model a client names), the
wire (rows, `models.list`) and the backends (the request's model) read one definition.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

# OpenClaw's thinking levels this gateway can honour (an `openai` agent sends each but `off` as the
# request's reasoning_effort, docs/agents.md), in OpenClaw's order.
THINKING_LEVELS = ("off", "minimal", "low", "medium", "high", "xhigh", "max")
# A session that chose no level runs with its agent's `thinking`, else this (OpenClaw's default).
DEFAULT_THINKING = "off"


def config_of(agent_id: str) -> dict[str, Any]:
    """The agent's settings, or {} for an agent that is not configured (any more)."""
    config = settings.GATEWAY_AGENTS.get(agent_id)
    return config if isinstance(config, dict) else {}


def models_of(config: dict[str, Any]) -> list[str]:
    """THE models a session of this agent may use: its `model` (the default) first, then its `models`.

    Entries that are not non-empty strings are left out here; `models_error` reports them.
    """
    listed = config.get("models")
    names = [config.get("model"), *(listed if isinstance(listed, list) else [])]
    found: list[str] = []
    for name in names:
        if isinstance(name, str) and name.strip() and name.strip() not in found:
            found.append(name.strip())
    return found


def models_error(config: dict[str, Any]) -> str | None:
    """What is wrong with the agent's `models` list (the system check and the `openai` backend's
    setup check both report it), or None."""
    listed = config.get("models", [])
    if not isinstance(listed, list) or not all(isinstance(m, str) and m.strip() for m in listed):
        return "models must be a list of model names"
    return None


def thinking_error(config: dict[str, Any]) -> str | None:
    """What is wrong with the agent's `thinking` (its sessions' default level), or None."""
    level = config.get("thinking")
    if level is not None and level not in THINKING_LEVELS:
        return f"thinking must be one of {', '.join(THINKING_LEVELS)}"
    return None


def default_model(config: dict[str, Any]) -> str:
    """The agent's own model ("" when it has none)."""
    model = config.get("model")
    return model.strip() if isinstance(model, str) else ""


def provider_of(agent_id: str) -> str | None:
    """Who serves the agent's models, as OpenClaw names a model's provider: its backend (None for
    an agent that is not configured, as `agents.list` does not list it)."""
    config = settings.GATEWAY_AGENTS.get(agent_id)
    if not isinstance(config, dict):
        return None
    return str(config.get("backend") or "scripted")


def session_model(config: dict[str, Any], override: str) -> str:
    """THE model a session of this agent runs with: its override while the agent still allows it,
    else the agent's default (an override the operator has since removed from `models` is ignored)."""
    return override if override and override in models_of(config) else default_model(config)


def thinking_default(config: dict[str, Any]) -> str:
    """The level a session of this agent that chose none runs with: the agent's `thinking`, else off."""
    level = config.get("thinking")
    return level if level in THINKING_LEVELS else DEFAULT_THINKING


def session_thinking(config: dict[str, Any], level: str) -> str:
    """THE thinking level a session runs with: its own, else its agent's default."""
    return level or thinking_default(config)


def resolve_model(agent_id: str, name: str) -> str | None:
    """The allowed model `name` means for this agent, or None: an id as listed, or `provider/id` as
    OpenClaw's model picker sends it (`openai/gpt-4o-mini`)."""
    allowed = models_of(config_of(agent_id))
    if name in allowed:
        return name
    provider = provider_of(agent_id)
    prefix = f"{provider}/"
    if provider is not None and name.startswith(prefix) and name[len(prefix) :] in allowed:
        return name[len(prefix) :]
    return None


def context_tokens(config: dict[str, Any]) -> int | None:
    """The agent's context budget in tokens (`context_tokens`), when it is configured as a number."""
    value = config.get("context_tokens")
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 1:
        return None
    return int(value)
