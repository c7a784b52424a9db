"""Session settings (docs/protocol-notes.md, "Session settings"): thinking and verbose levels, a
session's model, and what a new session runs with.
"""

from __future__ import annotations

from typing import Any

from chat.base import agents as catalog
from chat.protocol.errors import invalid
from chat.protocol.fields import require_unicode
from chat.protocol.keys import MAIN_KEY

# OpenClaw's thinking levels this gateway can honour (`chat.base.agents`, which the backends read too)
# and its verbose levels.
THINKING_LEVELS = catalog.THINKING_LEVELS
VERBOSE_LEVELS = ("off", "on", "full")
# The argument of /think, /verbose and /model that clears the session's setting (OpenClaw's word).
DEFAULT_SETTING = "default"


def setting_choices(setting: str, agent_id: str) -> list[str]:
    """The values a session setting accepts, as an error message lists them."""
    if setting == "thinkingLevel":
        return [*THINKING_LEVELS, DEFAULT_SETTING]
    if setting == "verboseLevel":
        return [*VERBOSE_LEVELS, DEFAULT_SETTING]
    return [*catalog.of(agent_id).models, DEFAULT_SETTING]


def setting_value(setting: str, raw: Any, agent_id: str, *, field: str) -> str:
    """A session setting's value from client input (levels case-insensitively; a model by its id or
    `provider/id`), or INVALID_REQUEST naming `field` and what it accepts."""
    if not isinstance(raw, str):
        raise invalid(f"{setting} must be a string or null", field=field)
    require_unicode(raw, field)
    text = raw.strip()
    if setting == "model":
        model = catalog.resolve_model(agent_id, text)
        if model is None:
            allowed = ", ".join(catalog.of(agent_id).models) or "none"
            raise invalid(f"agent {agent_id!r} has no model {text[:200]!r} (its models: {allowed})", field=field)
        return model
    levels = THINKING_LEVELS if setting == "thinkingLevel" else VERBOSE_LEVELS
    if text.lower() not in levels:
        raise invalid(f"{setting} must be one of {', '.join(levels)}", field=field)
    return text.lower()


def thinking_levels() -> list[dict[str, str]]:
    """The thinking levels a session may choose, as OpenClaw lists them (`{id, label}`)."""
    return [{"id": level, "label": level} for level in THINKING_LEVELS]


def session_defaults(agent_id: str) -> dict[str, Any]:
    """What a new session of `agent_id` runs with (`sessions.list` and `chat.startup` `defaults`).

    `modelSelectionTarget` is always `session`: a model chosen in a client applies to its session,
    never to the gateway's configuration (which no client edits here).
    """
    agent = catalog.of(agent_id)
    return {
        "agentId": agent_id,
        "modelProvider": agent.provider,
        "model": agent.model or None,
        "contextTokens": agent.context_tokens,
        "thinkingLevels": thinking_levels(),
        "thinkingOptions": list(THINKING_LEVELS),
        # what a session that chose no level runs with (OpenClaw's effort picker shows it)
        "thinkingDefault": agent.thinking_default,
        "mainKey": MAIN_KEY,
        "mainSessionKey": f"agent:{agent_id}:{MAIN_KEY}",
        "modelSelectionTarget": "session",
    }
