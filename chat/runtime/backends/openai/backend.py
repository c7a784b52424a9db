"""The `openai` backend: the setup check before the ack, and the dispatch of a run's request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from chat.runtime.backends.base import AgentBackend, DispatchError, RunContext, attachment_kind
from chat.runtime.backends.openai.settings import AgentSettings, settings_for
from chat.runtime.backends.openai.stream import ModelRun


class OpenAIBackend(AgentBackend):
    """Streams chat completions from an OpenAI-compatible endpoint."""

    # The transcript read for a run: the newest messages that can fit `context_chars`
    # are then chosen by `build_messages`; this only bounds the read.
    context_messages = 1000
    # Image bytes are not kept with a run, so they could not be sent: images are refused (a send's before
    # its ack, an HTTP request's as a 400 naming the part) rather than answered without.
    attachment_kinds = frozenset({"text"})

    def _settings(self) -> AgentSettings:
        return settings_for(self.agent_id, self.config)

    def check_setup(self, message: str, attachments: list[dict[str, Any]]) -> str | None:
        try:
            self._settings().api_key(self.agent_id)
        except ValueError as exc:
            return str(exc)
        for item in attachments:
            refused = self.refusal(attachment_kind(item))
            if refused is not None:
                return refused
        return None

    def takes_steering(self, message: str) -> bool:
        # taken between a step's calls and the next request: only a run with tools has such a boundary
        return self.uses_tools(message)

    async def start(self, ctx: RunContext) -> AsyncIterator[str]:
        try:
            settings = self._settings()
            api_key = settings.api_key(self.agent_id)
        except ValueError as exc:
            raise DispatchError(str(exc)) from exc
        run = ModelRun(self.agent, settings, api_key, ctx, self.config)
        try:
            await run.load_tools()
            await run.open(before_start=True)
        except BaseException:
            await run.close()
            raise
        return run.stream()
