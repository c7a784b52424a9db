"""What a model call costs, by the agent's price table, and what a run is estimated to cost before it
runs (docs/usage.md).

An agent's settings may carry `prices: {model: {input_per_mtok, output_per_mtok}}` (US dollars per
million tokens) and `max_run_tokens` (a cap on one run's tokens); a model without a price is counted
in tokens only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from django.conf import settings

from chat.base import agents as catalog
from sessions_app.lifecycle.usage import CallUsage, Estimate, priced

CHARS_PER_TOKEN = 4  # a rough count of tokens from text, where a backend reports none


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def _price(config: Mapping[str, Any], model: str) -> tuple[float, float] | None:
    prices = config.get("prices")
    if not isinstance(prices, Mapping):
        return None
    price = prices.get(model)
    if not isinstance(price, Mapping):
        return None
    try:
        return float(price.get("input_per_mtok", 0)), float(price.get("output_per_mtok", 0))
    except (TypeError, ValueError):
        return None


def cost_micros(config: Mapping[str, Any], model: str, input_tokens: int, output_tokens: int) -> int | None:
    """The cost in USD millionths (a price per million tokens is then a price in millionths per token)."""
    price = _price(config, model)
    if price is None:
        return None
    return priced(input_tokens, output_tokens, *price)


def max_run_tokens(config: Mapping[str, Any]) -> int | None:
    cap = config.get("max_run_tokens")
    return cap if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else None


def model_of(agent: catalog.Agent, session_model: str = "") -> str:
    """The model a run of this agent calls (the session's choice when the agent lists it)."""
    return catalog.session_model(agent, session_model) or agent.model or agent.backend


def output_cap(config: Mapping[str, Any]) -> int:
    cap = config.get("max_tokens")
    if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0:
        return cap
    return int(settings.GATEWAY_BUDGET_OUTPUT_TOKENS)


def admission_estimate(
    agent: catalog.Agent | None,
    message: str,
    attachments: list[dict[str, Any]],
    request: dict[str, Any] | None,
    api_token_id: int | None,
) -> Estimate:
    """What a send is reserved against its budgets: its prompt (message, text attachments, an HTTP
    request's own messages, the agent's system prompt, which every call sends), counted from text,
    plus its agent's output cap. (`lifecycle.usage.reserve` adds the conversation so far.)"""
    config: Mapping[str, Any] = agent.config if agent is not None else {}
    prompt = len(message) + sum(len(str(item.get("text") or "")) for item in attachments)
    prompt += len(str(config.get("system_prompt") or ""))
    if request:
        prompt += len(json.dumps(request, default=str))
    prompt_tokens = math.ceil(prompt / CHARS_PER_TOKEN)
    out = output_cap(config)
    price = _price(config, model_of(agent)) if agent is not None else None
    input_price, output_price = price or (0.0, 0.0)
    estimate = Estimate(
        tokens=prompt_tokens + out,
        api_token_id=api_token_id,
        output_cap=out,
        input_price=input_price,
        output_price=output_price,
    )
    estimate.cost_micros = estimate.call_cost(prompt_tokens, out)
    return estimate


def call_usage(
    config: Mapping[str, Any],
    model: str,
    step: int,
    report: Mapping[str, int] | None,
    *,
    prompt_text: str = "",
    output_text: str = "",
) -> CallUsage:
    """One model call's usage from its backend's report (`prompt_tokens`, `completion_tokens`,
    `cached_tokens`, `reasoning_tokens`), or estimated from its text when there is none."""
    if report and ("prompt_tokens" in report or "completion_tokens" in report):
        call = CallUsage(
            step=step,
            model=model,
            input_tokens=int(report.get("prompt_tokens", 0)),
            output_tokens=int(report.get("completion_tokens", 0)),
            cached_tokens=int(report.get("cached_tokens", 0)),
            reasoning_tokens=int(report.get("reasoning_tokens", 0)),
        )
    else:
        call = CallUsage(
            step=step,
            model=model,
            input_tokens=estimate_tokens(prompt_text),
            output_tokens=estimate_tokens(output_text),
            estimated=True,
        )
    call.cost_micros = cost_micros(config, model, call.input_tokens, call.output_tokens)
    return call
