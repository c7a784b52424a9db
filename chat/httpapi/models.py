"""Models are agents (HTTP-API.md §14.2): `GET /v1/models`, `GET /v1/models/{id}`, and how a
request's `model` (with OpenClaw's aliases) and `x-agentgate-model` header are read."""

from __future__ import annotations

import time
from typing import Any

from chat.base import agents as catalog
from chat.httpapi.errors import ApiError, bad_request
from chat.httpapi.http import JsonAnswer, Request
from chat.httpapi.routes import route

MODEL_HEADERS = ("x-agentgate-model", "x-openclaw-model")
# A model's `created`: when this process started (the agents carry no date of their own).
STARTED = int(time.time())
# OpenClaw's names for an agent (`{}` is the agent id); `openclaw` alone is the default agent.
PREFIXES = ("agentgate/", "openclaw/", "openclaw:", "agent:")
DEFAULT_NAMES = ("openclaw", "openclaw/default", "agentgate", "agentgate/default")


def agent_of(model: Any, *, param: str = "model") -> str:
    """The agent a request's `model` names (an id or one of its aliases); 404 `model_not_found`."""
    if not isinstance(model, str) or not model.strip():
        raise bad_request("model must be a non-empty string naming an agent (GET /v1/models lists them)", param)
    name = model.strip()
    if name in DEFAULT_NAMES:
        name = catalog.DEFAULT_AGENT
    else:
        for prefix in PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix) :]
                break
    if not catalog.known(name):
        raise ApiError(404, f"the model {model!r} does not exist", param=param, code="model_not_found")
    return name


def backend_model(req: Request, agent_id: str) -> str:
    """The backend model a request picks with `x-agentgate-model` (one of the agent's `models`), or
    "" for the agent's (or its session's) own; a 400 naming the header for any other."""
    asked = req.header(*MODEL_HEADERS)
    if asked is None or not asked.strip():
        return ""
    found = catalog.resolve_model(agent_id, asked.strip())
    if found is None:
        allowed = ", ".join(catalog.of(agent_id).models) or "none"
        raise bad_request(
            f"model {asked!r} is not one of agent {agent_id!r}'s models ({allowed})", param=MODEL_HEADERS[0]
        )
    return found


def model_object(agent: catalog.Agent) -> dict[str, Any]:
    return {"id": agent.id, "object": "model", "created": STARTED, "owned_by": "agentgate"}


@route("GET", r"^/v1/models$")
async def list_models(req: Request) -> JsonAnswer:
    agents = [agent for agent in catalog.all_agents().values() if agent.configured]
    return JsonAnswer({"object": "list", "data": [model_object(agent) for agent in agents]})


@route("GET", r"^/v1/models/(?P<model_id>.+)$")
async def get_model(req: Request, model_id: str) -> JsonAnswer:
    return JsonAnswer(model_object(catalog.of(agent_of(model_id))))
