"""Backend registry: agent id -> backend instance, from settings.GATEWAY_AGENTS."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from chat.runtime.backends.base import AgentBackend, BackendError, BackendTimeout, DispatchError, RunContext, capped
from chat.runtime.backends.scripted import ScriptedBackend

__all__ = ["AgentBackend", "BackendError", "BackendTimeout", "DispatchError", "RunContext", "capped", "get_backend"]


def _backend_class(name: str) -> type[AgentBackend] | None:
    if name == "scripted":
        return ScriptedBackend
    if name == "openai":
        try:  # imported on first use: the openai SDK is heavy, and a gateway may run without it
            from chat.runtime.backends.openai_backend import OpenAIBackend
        except ImportError:
            return None
        return OpenAIBackend
    return None


def agent_config(agent_id: str) -> dict[str, Any] | None:
    return settings.GATEWAY_AGENTS.get(agent_id)


def get_backend(agent_id: str) -> AgentBackend | None:
    """The backend for an agent, or None when the agent's backend is not available."""
    config = agent_config(agent_id)
    if config is None:
        return None
    cls = _backend_class(str(config.get("backend", "scripted")))
    return cls(agent_id, config) if cls is not None else None
