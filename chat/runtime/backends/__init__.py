"""Backend registry: agent id -> backend instance, from the agent catalog (`chat.base.agents`)."""

from __future__ import annotations

from chat.base import agents
from chat.runtime.backends.base import AgentBackend, BackendError, BackendTimeout, DispatchError, RunContext, capped
from chat.runtime.backends.scripted import ScriptedBackend

__all__ = ["AgentBackend", "BackendError", "BackendTimeout", "DispatchError", "RunContext", "capped", "get_backend"]


def _backend_class(name: str) -> type[AgentBackend] | None:
    if name == "scripted":
        return ScriptedBackend
    if name == "openai":
        try:  # imported on first use: the openai SDK is heavy, and a gateway may run without it
            from chat.runtime.backends.openai import OpenAIBackend
        except ImportError:
            return None
        return OpenAIBackend
    return None


def get_backend(agent_id: str) -> AgentBackend | None:
    """The backend for an agent, or None when the agent or its backend is not available."""
    agent = agents.get(agent_id)
    if agent is None:
        return None
    cls = _backend_class(agent.backend)
    return cls(agent.id, agent.config, agent=agent) if cls is not None else None
