"""An `openai` agent's settings: its configuration validated once into a frozen `AgentSettings`."""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from chat.base import agents as catalog

DEFAULT_BASE_URL = "https://api.openai.com/v1"
# Local servers ignore the key but the SDK insists on one.
PLACEHOLDER_API_KEY = "not-needed"
CHARS_PER_TOKEN = 4  # the budget approximation: a token is about four characters of English
# A session's thinking level (OpenClaw's names) is sent as the request's `reasoning_effort`, under
# the same word but for these: OpenAI's API refuses "max" (it goes up to "xhigh"), and `off` sends
# none, since models that do not reason refuse the parameter (docs/agents.md).
REASONING_EFFORT_RENAMED: dict[str, str | None] = {"off": None, "max": "xhigh"}


def reasoning_effort(level: str) -> str | None:
    """The `reasoning_effort` a thinking level is sent as, or None for none."""
    return REASONING_EFFORT_RENAMED.get(level, level)


@dataclass(frozen=True)
class AgentSettings:
    """One agent's validated configuration (see docs/agents.md for each key)."""

    model: str
    base_url: str = DEFAULT_BASE_URL
    api_key_env: str | None = None
    system_prompt: str = ""
    temperature: float | None = None
    max_tokens: int | None = None
    context_chars: int = 32_000
    first_token_timeout_ms: int = 60_000
    idle_timeout_ms: int = 30_000
    connect_timeout_ms: int = 10_000
    max_retries: int = 2
    retry_backoff_ms: int = 500
    max_retry_wait_ms: int = 20_000
    stream_usage: bool = True
    extra_body: dict[str, Any] | None = None
    # attachments (docs/files.md): whether the model takes images, the pixels an image is downscaled
    # to, whether earlier turns' images are sent again (else a placeholder names them), and the
    # characters of one message's documents the model is given
    vision: bool = False
    max_image_pixels: int = 1_048_576
    history_images: bool = True
    document_chars: int = 20_000

    @classmethod
    def from_config(cls, agent_id: str, config: Mapping[str, Any]) -> AgentSettings:
        """Validate `config`; raise ValueError with a message fit for the user."""
        where = f"agent {agent_id!r}"
        model = config.get("model")
        if not isinstance(model, str) or not model.strip():
            raise ValueError(f"{where} has no model configured")

        def number(key: str, default: int, minimum: int = 0) -> int:
            value = config.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
                raise ValueError(f"{where}: {key} must be a number >= {minimum}")
            return int(value)

        def flag(key: str, default: bool) -> bool:
            value = config.get(key, default)
            if not isinstance(value, bool):
                raise ValueError(f"{where}: {key} must be true or false")
            return value

        def optional_str(key: str) -> str | None:
            value = config.get(key)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{where}: {key} must be a string")
            return value or None

        budget = number("context_chars", cls.context_chars, 1)
        if "context_tokens" in config:
            by_tokens = number("context_tokens", 0, 1) * CHARS_PER_TOKEN
            budget = min(budget, by_tokens) if "context_chars" in config else by_tokens
        temperature = config.get("temperature")
        if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, float | int)):
            raise ValueError(f"{where}: temperature must be a number")
        max_tokens = config.get("max_tokens")
        if max_tokens is not None:
            max_tokens = number("max_tokens", 1, 1)
        extra_body = config.get("extra_body")
        if extra_body is not None and not isinstance(extra_body, dict):
            raise ValueError(f"{where}: extra_body must be an object")
        problem = catalog.models_error(config) or catalog.thinking_error(config)
        if problem is not None:
            raise ValueError(f"{where}: {problem}")
        base_url = optional_str("base_url") or DEFAULT_BASE_URL
        try:
            parts = urlsplit(base_url)
            _ = parts.port  # raises ValueError for a malformed or out-of-range port
            valid_url = parts.scheme in ("http", "https") and bool(parts.hostname)
        except ValueError:
            valid_url = False
        if not valid_url:
            raise ValueError(f"{where}: base_url must be an http:// or https:// URL")
        return cls(
            model=model.strip(),
            base_url=base_url,
            api_key_env=optional_str("api_key_env"),
            system_prompt=optional_str("system_prompt") or "",
            temperature=float(temperature) if temperature is not None else None,
            max_tokens=max_tokens,
            context_chars=budget,
            first_token_timeout_ms=number("first_token_timeout_ms", cls.first_token_timeout_ms, 1),
            idle_timeout_ms=number("idle_timeout_ms", cls.idle_timeout_ms, 1),
            connect_timeout_ms=number("connect_timeout_ms", cls.connect_timeout_ms, 1),
            max_retries=number("max_retries", cls.max_retries),
            retry_backoff_ms=number("retry_backoff_ms", cls.retry_backoff_ms),
            max_retry_wait_ms=number("max_retry_wait_ms", cls.max_retry_wait_ms),
            stream_usage=flag("stream_usage", True),
            extra_body=extra_body,
            vision=flag("vision", False),
            max_image_pixels=number("max_image_pixels", cls.max_image_pixels, 1),
            history_images=flag("history_images", True),
            document_chars=number("document_chars", cls.document_chars, 1),
        )

    def api_key(self, agent_id: str) -> str:
        """The key from the environment; raise ValueError when a named variable is unset."""
        if self.api_key_env is None:
            return PLACEHOLDER_API_KEY
        key = os.environ.get(self.api_key_env, "").strip()
        if not key:
            raise ValueError(f"agent {agent_id!r}: environment variable {self.api_key_env} is not set")
        return key


# agent id -> (the configuration as it was parsed, its settings); one entry per agent
_PARSED: dict[str, tuple[dict[str, Any], AgentSettings]] = {}


def settings_for(agent_id: str, config: Mapping[str, Any]) -> AgentSettings:
    """The agent's settings, parsed once per configuration; raise ValueError as `from_config` does.

    Keyed by what the configuration says, not by the dict that holds it: settings replaced
    (`override_settings`) or edited in place are parsed again. The settings are built from a
    copy, so a later edit of the live dict cannot reach the cached ones (`extra_body`). A bad
    configuration is not kept: it fails every send before its ack anyway.
    """
    parsed = _PARSED.get(agent_id)
    if parsed is not None and parsed[0] == config:
        return parsed[1]
    snapshot = copy.deepcopy(dict(config))
    settings = AgentSettings.from_config(agent_id, snapshot)
    _PARSED[agent_id] = (snapshot, settings)
    return settings
