"""A run's model calls as the executor records them (docs/usage.md): each call that ends mid-run in a
transaction of its own, the last with the run's end."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from chat.base import agents as catalog
from chat.base import metering
from chat.base.db import db_write
from chat.runtime.backends import RunContext
from sessions_app.lifecycle import runs
from sessions_app.lifecycle.usage import CallUsage
from sessions_app.models import Run

# `DatabaseWait.patiently`: a database call tried again while the database is away
Patiently = Callable[..., Awaitable[Any]]


async def record_call(patiently: Patiently, run_pk: int, ctx: RunContext, call: CallUsage, again: bool) -> bool:
    """Record a model call that ended mid-run (`RunContext.record_call`); True when the run must stop
    before its next step: a budget is spent, or cannot take the next call (`again`: the run means
    to make one), or the run's own cap (`max_run_tokens`) is reached. A second try of the write
    records nothing twice (a step is recorded once)."""
    spent = await patiently(db_write, runs.record_step, run_pk, call, again)
    ctx.recorded.append(call)
    cap = metering.max_run_tokens(ctx.agent)
    return bool(spent) or (cap is not None and sum(c.tokens for c in ctx.recorded) >= cap)


def calls_at_end(run: Run, ctx: RunContext, reply: str) -> list[CallUsage]:
    """The model calls recorded with the run's end: those its backend left, else one from its reported
    usage (a backend that does not report per call), else one estimated from its text."""
    if ctx.calls or ctx.recorded:
        return ctx.calls  # a backend that reports per call (a call that failed midway is not counted)
    agent = catalog.get(run.session.agent_id)
    model = metering.model_of(agent, ctx.model) if agent is not None else ""
    prompt = ctx.message + "".join(str(m.get("text", "")) for m in ctx.transcript)
    return [metering.call_usage(ctx.agent, model, 1, ctx.usage, prompt_text=prompt, output_text=reply)]
