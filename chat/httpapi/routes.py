"""The route table of the HTTP API: each handler module registers its routes with `@route`.

A handler is `async def handler(req: Request, **path_params) -> Answer`, called once the caller is
authenticated, holds the route's scope (GET needs `read`, POST and DELETE `write`, unless the
route names another) and is within its rate. Path parameters are the pattern's named groups.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from chat.httpapi.errors import ApiError
from chat.httpapi.http import Answer
from sessions_app.models import KeyScope

Handler = Callable[..., Awaitable[Answer]]

# The modules whose import registers the API's routes; one not there yet is skipped.
HANDLER_MODULES = ("chat.httpapi.models", "chat.httpapi.completions", "chat.httpapi.responses")
DEFAULT_SCOPES = {"GET": KeyScope.READ, "POST": KeyScope.WRITE, "DELETE": KeyScope.WRITE}


@dataclass(frozen=True)
class Route:
    method: str
    pattern: re.Pattern[str]
    scope: KeyScope
    handler: Handler
    name: str  # the metrics' `route` label: the pattern as a path template

    def match(self, path: str) -> dict[str, str] | None:
        found = self.pattern.match(path)
        return found.groupdict() if found else None


ROUTES: list[Route] = []


def _template(pattern: str) -> str:
    """`^/v1/responses/(?P<response_id>[^/]+)$` → `/v1/responses/{response_id}` (a bounded label)."""
    text = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", pattern)
    return text.strip("^$")


def route(method: str, pattern: str, *, scope: KeyScope | None = None) -> Callable[[Handler], Handler]:
    """Register `handler` for `method` on paths matching `pattern` (a regex, anchored)."""

    def register(handler: Handler) -> Handler:
        ROUTES.append(
            Route(
                method.upper(),
                re.compile(pattern),
                scope or DEFAULT_SCOPES[method.upper()],
                handler,
                _template(pattern),
            )
        )
        return handler

    return register


def load_handlers() -> None:
    """Import every handler module there is (idempotent: Python imports each once)."""
    for name in HANDLER_MODULES:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)


def resolve(method: str, path: str) -> tuple[Route, dict[str, Any]]:
    """The route for this request, or 404 (no such path) / 405 (path known, method not: `Allow` says which)."""
    allowed: list[str] = []
    for candidate in ROUTES:
        params = candidate.match(path)
        if params is None:
            continue
        if candidate.method == method:
            return candidate, params
        allowed.append(candidate.method)
    if allowed:
        raise ApiError(
            405,
            f"{method} is not allowed on {path}; use {', '.join(sorted(set(allowed)))}",
            code="method_not_allowed",
            headers={"allow": ", ".join(sorted(set(allowed)))},
        )
    raise ApiError(404, f"no such endpoint: {path}", code="unknown_url")
