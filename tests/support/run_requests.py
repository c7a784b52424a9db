"""Runs that carry an HTTP request (`Run.request`, HTTP-API.md §14.3-14.5) without the HTTP door: a
`chat.send` whose runId is registered here is admitted as an HTTP run with that request (and, if given,
another message: a request that brings only tool results has none). Everything after admission — the
executor, the backends, the lifecycle — is the real path."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from sessions_app import statements
from sessions_app.models import Run, RunSurface
from sessions_app.run_requests import RunRequest


@dataclass
class HttpRuns:
    """runId -> the request its run is admitted with (and the message it stands for, when not the send's)."""

    requests: dict[str, RunRequest] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)

    def add(self, run_id: str, request: RunRequest, *, message: str | None = None) -> None:
        self.requests[run_id] = request
        if message is not None:
            self.messages[run_id] = message

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real, real_if_current = statements.insert, statements.insert_run_if_current

        def as_http(instance: Any) -> None:
            if isinstance(instance, Run) and instance.run_id in self.requests:
                instance.request = self.requests[instance.run_id].as_json()
                instance.surface = RunSurface.HTTP
                instance.message = self.messages.get(instance.run_id, instance.message)

        def insert(instance: Any) -> Any:
            as_http(instance)
            return real(instance)

        def insert_run_if_current(run: Run, session: Any) -> bool:
            as_http(run)
            return real_if_current(run, session)

        # the two ways admission inserts a run (`runs.admit_send`)
        monkeypatch.setattr(statements, "insert", insert)
        monkeypatch.setattr(statements, "insert_run_if_current", insert_run_if_current)
