"""What an HTTP request asks of the model's requests (HTTP-API.md §14.4, §14.5): its client function tools,
its `tool_choice` and its sampling parameters, in OpenAI's terms."""

from __future__ import annotations

from typing import Any

from sessions_app.run_requests import RunRequest

# The sampling parameters passed on as the request names them (anything else in `params` is not sent).
PASSED_PARAMS = (
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
)
TOKEN_CAPS = ("max_tokens", "max_completion_tokens")  # either replaces the agent's own `max_tokens`
FORCED_CHOICES = ("required",)  # and a named function: they hold only for the first step


def client_tool_defs(request: RunRequest) -> list[dict[str, Any]]:
    """The client's function tools, offered under the names it gave them."""
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters or {"type": "object", "properties": {}},
            },
        }
        for tool in request.client_tools
    ]


def tool_choice(request: RunRequest, step: int) -> str | dict[str, Any] | None:
    """The step's `tool_choice`, None for the model's default. A forced choice (`required`, a named
    function) holds for the first step only: forced on every step, the model could never answer."""
    choice = request.tool_choice
    if not choice:
        return None
    if isinstance(choice, dict):
        if step > 1:
            return "auto"
        name = choice.get("name") or (choice.get("function") or {}).get("name")  # ours, or OpenAI's own shape
        return {"type": "function", "function": {"name": str(name or "")}}
    if choice in FORCED_CHOICES and step > 1:
        return "auto"
    return choice


def sampling(request: RunRequest, *, with_tools: bool) -> dict[str, Any]:
    """The request's sampling parameters to send (`parallel_tool_calls` only beside tools: servers refuse
    it alone)."""
    passed = {name: request.params[name] for name in PASSED_PARAMS if request.params.get(name) is not None}
    if with_tools and request.params.get("parallel_tool_calls") is not None:
        passed["parallel_tool_calls"] = request.params["parallel_tool_calls"]
    return passed
