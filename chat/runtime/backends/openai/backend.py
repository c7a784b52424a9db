"""The `openai` backend: the setup check before the ack, and the dispatch of a run's request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from chat.base.db import db_read
from chat.files import images
from chat.runtime.backends.base import AgentBackend, DispatchError, RunContext, attachment_kind
from chat.runtime.backends.openai.settings import AgentSettings, settings_for
from chat.runtime.backends.openai.stream import ModelRun


async def _images(ctx: RunContext, settings: AgentSettings) -> dict[str, str]:
    """The run's images (and, unless the agent says not, its transcript's) as data URLs, by file id."""
    if not settings.vision:
        return {}
    ids = images.file_ids(ctx.attachments)
    if settings.history_images:
        for entry in ctx.transcript:
            ids += images.file_ids(entry.get("attachments") or [])
    if not ids:
        return {}
    return await db_read(images.load, ids, settings.max_image_pixels)


class OpenAIBackend(AgentBackend):
    """Streams chat completions from an OpenAI-compatible endpoint."""

    # The transcript read for a run: the newest messages that can fit `context_chars`
    # are then chosen by `build_messages`; this only bounds the read.
    context_messages = 1000

    def _settings(self) -> AgentSettings:
        return settings_for(self.agent_id, self.config)

    def refusal(self, kind: str) -> str | None:
        """Images go only to a model its agent marks `vision: true`; to another a send is refused (before
        its ack; an HTTP request's part as a 400) rather than answered without them."""
        if kind != "image":
            return None
        try:
            vision = self._settings().vision
        except ValueError as exc:
            return str(exc)
        if vision:
            return None
        return f"agent {self.agent_id!r} cannot take images: its model is not marked `vision: true`"

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
        pictures = await _images(ctx, settings)
        run = ModelRun(self.agent, settings, api_key, ctx, self.config, pictures)
        try:
            await run.load_tools()
            await run.open(before_start=True)
        except BaseException:
            await run.close()
            raise
        return run.stream()
