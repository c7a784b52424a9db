"""An `openai` agent's settings: parsed once per configuration, and parsed again when it changes."""

from __future__ import annotations

from typing import Any

from chat.runtime.backends.openai import OpenAIBackend
from chat.runtime.backends.openai.settings import settings_for
from tests.chat.test_openai_backend import make_ctx, run_backend
from tests.support.fake_openai import FakeOpenAI, agent_config


def test_a_configuration_is_parsed_once_and_again_when_it_changes():
    config: dict[str, Any] = {"backend": "openai", "model": "m", "extra_body": {"keep_alive": "5m"}}
    first = settings_for("llm", config)
    assert settings_for("llm", config) is first
    assert settings_for("llm", dict(config)) is first  # the same settings in another dict
    config["model"] = "other"  # edited in place
    assert settings_for("llm", config).model == "other"
    config["extra_body"]["keep_alive"] = "1m"  # a nested value, edited in place
    edited = settings_for("llm", config)
    assert edited.extra_body == {"keep_alive": "1m"} and first.extra_body == {"keep_alive": "5m"}
    assert settings_for("helper", config) is not edited  # another agent's settings, and its messages
    assert settings_for("llm", config) is edited


async def test_a_replaced_agent_configuration_reaches_the_next_run(settings: Any, fake: FakeOpenAI):
    settings.GATEWAY_AGENTS = {**settings.GATEWAY_AGENTS, "llm": agent_config(fake, system_prompt="One.")}
    await run_backend(OpenAIBackend("llm", settings.GATEWAY_AGENTS["llm"]), make_ctx())
    settings.GATEWAY_AGENTS = {**settings.GATEWAY_AGENTS, "llm": agent_config(fake, system_prompt="Two.")}
    await run_backend(OpenAIBackend("llm", settings.GATEWAY_AGENTS["llm"]), make_ctx())
    assert [r.messages[0]["content"] for r in fake.requests] == ["One.", "Two."]
