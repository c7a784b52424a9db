"""System checks: a configuration the gateway cannot serve fails at start, with the reason."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from chat.checks import agent_table


def test_the_default_agents_pass() -> None:
    assert agent_table() == []


@override_settings(GATEWAY_AGENTS={"main": {"backend": "scripted"}, "gpt-4.1": {"backend": "openai"}})
def test_an_agent_id_the_protocol_refuses_is_an_error() -> None:
    """It was offered by agents.list and then refused on every new chat (INVALID_REQUEST)."""
    (error,) = agent_table()
    assert error.id == "agentgate.E001" and "'gpt-4.1'" in error.msg
    with pytest.raises(SystemCheckError, match=r"agentgate\.E001"):
        call_command("check")


@override_settings(GATEWAY_AGENTS={"main": "scripted"})
def test_an_agent_that_is_not_an_object_is_an_error() -> None:
    (error,) = agent_table()
    assert error.id == "agentgate.E002"
