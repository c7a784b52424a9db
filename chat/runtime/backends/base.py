"""The small interface every agent backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any


class DispatchError(Exception):
    """The run could not start (model unreachable, refused, misconfigured)."""


class BackendError(Exception):
    """The run failed after it started; `kind` is a protocol errorKind."""

    def __init__(self, message: str, kind: str = "backend") -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class BackendTimeout(BackendError):
    """A backend-level timeout (first token, idle): the run ends `timeout`."""

    def __init__(self, message: str) -> None:
        super().__init__(message, kind="timeout")


@dataclass
class RunContext:
    """Everything a backend needs to execute one run."""

    run_pk: int
    run_id: str
    session_key: str
    session_id: str
    agent_id: str
    agent: dict[str, Any]
    message: str
    attachments: list[dict[str, Any]] = field(default_factory=list)
    transcript: list[dict[str, Any]] = field(default_factory=list)  # [{role, text, aborted}] oldest first
    timeout_ms: int = 600_000
    # reported by the backend; the executor stores them with the run's end
    stop_reason: str = "stop"
    usage: dict[str, int] | None = None
    cancel_ms: int | None = None  # how long releasing its work took, when it timed out


class AgentBackend(ABC):
    """An agent backend: a setup check before the ack, then start and stream."""

    # how many of the newest transcript messages `start` reads (this run's user message included)
    context_messages: int = 0

    def __init__(self, agent_id: str, config: dict[str, Any]) -> None:
        self.agent_id = agent_id
        self.config = config

    def check_setup(self, message: str, attachments: list[dict[str, Any]]) -> str | None:
        """Return an error text when this send cannot be accepted at all (§4 'fail before the ack')."""
        return None

    @abstractmethod
    async def start(self, ctx: RunContext) -> AsyncIterator[str]:
        """Dispatch phase: get ready and return the text stream. Raise DispatchError on failure.

        The returned iterator yields text chunks; cancelling the task must release
        any resource (close the HTTP request).
        """
