"""Run starts, outcomes, durations and tokens, counted from the `run_transitioned` signal (connected in
`ChatConfig.ready`) once the transition has committed."""

from __future__ import annotations

from functools import partial
from typing import Any

from django.db import transaction

from chat.base.metrics import (
    MODEL_CALLS,
    MODEL_COST,
    MODEL_TOKENS,
    RUN_DURATION_SECONDS,
    RUNS_ENDED,
    RUNS_STARTED,
    TOKENS,
)
from sessions_app.lifecycle.usage import CallUsage
from sessions_app.models import ACTIVE_STATES, TERMINAL_STATES, ChatSession, Run, RunState


def _observe_end(
    agent: str,
    state: str,
    error_kind: str,
    surface: str,
    seconds: float | None,
    prompt: int | None,
    completion: int | None,
) -> None:
    RUNS_ENDED.labels(agent, state, error_kind or "", surface).inc()
    if seconds is not None:
        RUN_DURATION_SECONDS.labels(agent, state).observe(seconds)
    if prompt and prompt > 0:  # a backend's odd usage report must not raise here
        TOKENS.labels(agent, "prompt").inc(prompt)
    if completion and completion > 0:
        TOKENS.labels(agent, "completion").inc(completion)


def on_run_transition(
    sender: Any, run: Run, from_state: str, to_state: str, session: ChatSession | None = None, **kwargs: Any
) -> None:
    """`run_transitioned` receiver (connected in ChatConfig.ready): admissions, outcomes, duration, tokens."""
    agent = session.agent_id if session is not None else ""
    surface = run.surface or "ws"
    if to_state == RunState.DISPATCHING:
        transaction.on_commit(partial(RUNS_STARTED.labels(agent, surface).inc), robust=True)
    if to_state not in TERMINAL_STATES:
        return
    seconds = None
    if from_state in ACTIVE_STATES and run.dispatched_at is not None and run.ended_at is not None:
        seconds = max(0.0, (run.ended_at - run.dispatched_at).total_seconds())
    # Counted after commit: a transition that rolls back never happened.
    transaction.on_commit(
        partial(
            _observe_end, agent, to_state, run.error_kind, surface, seconds, run.prompt_tokens, run.completion_tokens
        ),
        robust=True,  # a hook that raised would fail the writer's whole batch after it committed
    )


def _observe_calls(agent: str, calls: list[CallUsage]) -> None:
    for call in calls:
        kinds = {
            "input": call.input_tokens,
            "output": call.output_tokens,
            "cached": call.cached_tokens,
            "reasoning": call.reasoning_tokens,
        }
        for kind, count in kinds.items():
            if count > 0:
                MODEL_TOKENS.labels(agent, call.model, kind).inc(count)
        if call.cost_micros:
            MODEL_COST.labels(agent, call.model).inc(call.cost_micros / 1e6)
        reported = "unknown" if call.unknown else "estimated" if call.estimated else "reported"
        MODEL_CALLS.labels(agent, call.model, reported).inc()


def on_usage_recorded(sender: Any, agent_id: str, calls: list[CallUsage], **kwargs: Any) -> None:
    """`usage_recorded` receiver: tokens and cost by agent and model, once the calls' rows committed."""
    transaction.on_commit(partial(_observe_calls, agent_id, list(calls)), robust=True)
