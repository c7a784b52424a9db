"""Usage and budgets: each model call's usage recorded once, reservations against budgets taken at
admission, settled call by call and released when the run ends.

Every function runs inside its caller's transaction (admission, a step's end, a run's end), so a
call's usage, its session's totals and its budgets' counters commit together or not at all.

Concurrency: a budget's counters change only by conditional `UPDATE`s (`_reserve`), which on
PostgreSQL take the budget's row lock and re-check their condition on the row as committed by a
racing writer; budgets are always taken in id order (no deadlock). SQLite serialises every writer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import connection, transaction
from django.db.models import F, Q
from django.db.models.signals import post_delete, post_save
from django.utils import timezone

from sessions_app import signals, statements
from sessions_app.models import Budget, BudgetPeriod, BudgetScope, ChatSession, Run, UsageRecord

# the session row's usage totals
TOTAL_FIELDS = ("total_input_tokens", "total_output_tokens", "total_cost_micros")


@dataclass
class CallUsage:
    """One model call's usage as its backend reported it (or as estimated from its text)."""

    step: int
    model: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    estimated: bool = False
    unknown: bool = False
    cost_micros: int | None = None  # None: no price for its model

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


def priced(input_tokens: int, output_tokens: int, input_price: float, output_price: float) -> int:
    """A call's cost in USD millionths, its prices in USD per million tokens (so millionths per token)."""
    return round(input_tokens * input_price + output_tokens * output_price)


@dataclass
class Estimate:
    """What admission reserves for one run against every budget that applies: the send's own part
    (`tokens`, `cost_micros`); `reserve` adds the session's conversation so far, which the model is
    sent again. The prices and the output cap also size each further call of the run (`_cover_next`)."""

    tokens: int
    cost_micros: int = 0
    api_token_id: int | None = None
    output_cap: int = 0  # the most one model call may answer, in tokens
    input_price: float = 0.0  # USD millionths per token (a price per million tokens, in dollars)
    output_price: float = 0.0

    def call_cost(self, input_tokens: int, output_tokens: int) -> int:
        return priced(input_tokens, output_tokens, self.input_price, self.output_price)


class OverBudget(Exception):
    """A send that would take a budget over its limit: nothing is admitted."""

    def __init__(self, budget: Budget, resets_at: datetime | None) -> None:
        self.name = str(budget)
        self.budget_id = budget.pk
        self.resets_at = resets_at
        until = f"; it resets at {resets_at.isoformat()}" if resets_at else ""
        super().__init__(f"budget {self.name!r} is spent{until}")


# --- periods -------------------------------------------------------------------------------------


def period_start(period: str, now: datetime) -> datetime | None:
    """The start (UTC) of the period `now` is in; None for a budget that never resets."""
    day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == BudgetPeriod.DAY:
        return day
    if period == BudgetPeriod.WEEK:
        return day - timedelta(days=day.weekday())
    if period == BudgetPeriod.MONTH:
        return day.replace(day=1)
    return None


def period_end(period: str, now: datetime) -> datetime | None:
    """When the period `now` is in ends (the budget resets); None for `total`."""
    start = period_start(period, now)
    if start is None:
        return None
    if period == BudgetPeriod.DAY:
        return start + timedelta(days=1)
    if period == BudgetPeriod.WEEK:
        return start + timedelta(days=7)
    return (start + timedelta(days=32)).replace(day=1)


def _roll(budget_id: int, period: str, now: datetime) -> None:
    """Start the budget's current period if it has not been started: its usage back to zero
    (reservations of runs still going stay)."""
    start = period_start(period, now)
    if start is None:
        return
    Budget.objects.filter(pk=budget_id).filter(Q(period_start__isnull=True) | Q(period_start__lt=start)).update(
        period_start=start, used_tokens=0, used_cost_micros=0
    )


# --- do budgets apply at all? ------------------------------------------------------------------

_check: dict[str, Any] = {"at": float("-inf"), "any": False}


def budgets_may_apply() -> bool:
    """Whether any budget is enabled (or a default for users is set): admission of a send with none
    costs no statement for budgets. Read at most every GATEWAY_BUDGET_CHECK_SECONDS per process;
    a budget saved in this process is seen at once."""
    if settings.GATEWAY_DEFAULT_USER_BUDGET:
        return True
    now = time.monotonic()
    if now - _check["at"] >= settings.GATEWAY_BUDGET_CHECK_SECONDS:
        _check["any"] = Budget.objects.filter(enabled=True).exists()
        _check["at"] = now
    return bool(_check["any"])


def forget_budget_check(**_kwargs: Any) -> None:
    _check["at"] = float("-inf")


post_save.connect(forget_budget_check, sender=Budget, dispatch_uid="usage-budget-saved")
post_delete.connect(forget_budget_check, sender=Budget, dispatch_uid="usage-budget-deleted")


# --- admission ----------------------------------------------------------------------------------


def applicable(owner_id: int, agent_id: str, api_token_id: int | None) -> list[Budget]:
    """The enabled budgets a send of this owner to this agent (by this API key) counts against, by id."""
    groups = Group.user_set.through.objects.filter(user_id=owner_id).values("group_id")
    match = (
        Q(scope=BudgetScope.USER, user_id=owner_id)
        | Q(scope=BudgetScope.GROUP, group_id__in=groups)
        | Q(scope=BudgetScope.AGENT, agent_id=agent_id)
    )
    if api_token_id is not None:
        match |= Q(scope=BudgetScope.API_KEY, api_token_id=api_token_id)
    return list(Budget.objects.filter(match, enabled=True).order_by("id"))


def _default_user_budget(owner_id: int) -> Budget | None:
    """The settings' default budget for a user that has no budget of their own yet (created once)."""
    default = settings.GATEWAY_DEFAULT_USER_BUDGET
    if not default or Budget.objects.filter(scope=BudgetScope.USER, user_id=owner_id).exists():
        return None
    cost = default.get("max_cost_usd")
    return Budget.objects.create(
        name="default",
        scope=BudgetScope.USER,
        user_id=owner_id,
        period=default.get("period", BudgetPeriod.MONTH),
        max_tokens=default.get("max_tokens"),
        max_cost_micros=None if cost is None else round(cost * 1_000_000),
    )


def context_tokens(session: ChatSession | None) -> int:
    """What the session's next model call is sent again of its conversation so far: the last
    recorded call of its current transcript, its input and the reply to it (one indexed read; a
    reset transcript has none). A session whose active branch was rewound is over-counted (it is
    sent less); a fork's first run is counted from its own text only."""
    if session is None or session.pk is None:
        return 0
    current = Run.objects.filter(session_id=session.pk, session_generation=session.session_id).values("pk")
    last = (
        UsageRecord.objects.filter(session_pk=session.pk, unknown=False, run_pk__in=current)
        .order_by("-id")
        .values_list("input_tokens", "output_tokens")
        .first()
    )
    return sum(last) if last else 0


def reserve(
    owner_id: int, agent_id: str, estimate: Estimate, session: ChatSession | None = None
) -> dict[str, Any] | None:
    """Reserve `estimate`, with the session's conversation so far (`context_tokens`), against every
    budget that applies, each by one conditional UPDATE; the run's `budget` (what it holds), or None
    when no budget applies. Raises `OverBudget` (the caller's transaction then undoes every
    reservation taken before)."""
    if not budgets_may_apply():
        return None
    if settings.GATEWAY_DEFAULT_USER_BUDGET:
        # two first sends of a new user must not both create the default (PostgreSQL; SQLite serialises)
        statements.lock_name(f"budget-default:{owner_id}")
        _default_user_budget(owner_id)
    budgets = applicable(owner_id, agent_id, estimate.api_token_id)
    if not budgets:
        return None
    context = context_tokens(session)
    tokens, cost = estimate.tokens + context, estimate.cost_micros + estimate.call_cost(context, 0)
    now = timezone.now()
    held = [[b.pk, b.period] for b in budgets]
    refused = _take(held, tokens, cost, now)
    if refused is not None:
        budget = next(b for b in budgets if b.pk == refused)
        raise OverBudget(budget, period_end(budget.period, now))
    return {
        "budgets": held,
        "tokens": tokens,
        "cost": cost,
        "apiKey": estimate.api_token_id,
        "released": False,
        # what sizes each further call of the run (`_cover_next`)
        "next": [estimate.output_cap, estimate.input_price, estimate.output_price],
    }


def _take(budgets: list[list[Any]], tokens: int, cost: int, now: datetime) -> int | None:
    """Add `tokens`/`cost` to each budget's reservation where it still fits under its limits (one
    conditional UPDATE each, in id order); the id of the first budget it did not fit, or None. The
    caller's transaction (or savepoint) undoes what was taken before a refusal."""
    for budget_id, period in budgets:
        _roll(budget_id, period, now)
        taken = (
            Budget.objects.filter(pk=budget_id)
            .filter(Q(max_tokens__isnull=True) | Q(max_tokens__gte=F("used_tokens") + F("reserved_tokens") + tokens))
            .filter(
                Q(max_cost_micros__isnull=True)
                | Q(max_cost_micros__gte=F("used_cost_micros") + F("reserved_cost_micros") + cost)
            )
            .update(
                reserved_tokens=F("reserved_tokens") + tokens, reserved_cost_micros=F("reserved_cost_micros") + cost
            )
        )
        if not taken:
            return int(budget_id)
    return None


# --- recording a call -------------------------------------------------------------------------


@cache
def _insert_sql(vendor: str) -> tuple[str, tuple[str, ...]]:
    fields = tuple(f.column for f in UsageRecord._meta.concrete_fields if not f.primary_key)
    quote = connection.ops.quote_name
    sql = (
        f"INSERT INTO {quote(UsageRecord._meta.db_table)} ({', '.join(quote(c) for c in fields)}) "
        f"VALUES ({', '.join(['%s'] * len(fields))}) ON CONFLICT (run_pk, step) DO NOTHING RETURNING id"
    )
    return sql, fields


def _insert(row: UsageRecord) -> bool:
    """Insert the call's row unless its step is recorded already: True when it was inserted now."""
    sql, columns = _insert_sql(connection.vendor)
    by_column = {f.column: f for f in UsageRecord._meta.concrete_fields}
    params = [by_column[c].get_db_prep_save(getattr(row, by_column[c].attname), connection) for c in columns]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone() is not None


def record_calls(
    run: Run,
    session: ChatSession,
    calls: list[CallUsage],
    *,
    save_row: Callable[..., None],
    row_saved_later: bool = False,
    then_call: bool = False,
    at_end: bool = False,
) -> bool:
    """Record the calls' usage (a step already recorded is skipped: a retried write counts once), add
    it to the session's totals and settle it against the run's budgets. True when a budget of the
    run is now spent, or, `then_call` (the run means to ask its model again), when the run's
    reservation cannot be made to cover that call (`_cover_next`): the run must not ask again.

    The caller holds the session's lock. The totals go into the locked row, saved by `save_row`
    (`core.save_row`: its version moves), or, `row_saved_later`, by the caller's own save of the row
    in the same transaction (the run's end saves it: no statement of its own).

    `at_end`: recorded by the run's end, inside its `statements.inserts_together` block: the rows go
    in with its audit rows (one statement on PostgreSQL). Its calls are never recorded before (an
    active run's end records only the calls not recorded mid-run, and an ended run records nothing),
    so they are counted without the conflict check a mid-run retry needs."""
    now = timezone.now()
    tokens = [0, 0, 0]  # input, output, cost
    inserted: list[CallUsage] = []
    for call in calls:
        row = UsageRecord(
            run_pk=run.pk,
            step=call.step,
            run_id=run.run_id,
            session_pk=session.pk,
            session_key=session.key,
            user_id=session.owner_id,
            api_token_id=(run.budget or {}).get("apiKey"),
            agent_id=session.agent_id,
            model=call.model[:200],
            input_tokens=call.input_tokens,
            output_tokens=call.output_tokens,
            cached_tokens=call.cached_tokens,
            reasoning_tokens=call.reasoning_tokens,
            estimated=call.estimated,
            unknown=call.unknown,
            cost_micros=call.cost_micros,
            day=now.astimezone(UTC).date(),
            created_at=now,
        )
        if at_end:
            statements.insert_later(row)
        if at_end or _insert(row):
            inserted.append(call)
            tokens[0] += call.input_tokens
            tokens[1] += call.output_tokens
            tokens[2] += call.cost_micros or 0
    if inserted:
        signals.usage_recorded.send(sender=UsageRecord, agent_id=session.agent_id, calls=inserted)
    if not any(tokens):
        # a second try of a write that committed: what the first found, found again
        return _spent(run) or (then_call and not _covered(run, calls[-1]))
    session.total_input_tokens += tokens[0]
    session.total_output_tokens += tokens[1]
    session.total_cost_micros += tokens[2]
    if not row_saved_later:
        save_row(session, *TOTAL_FIELDS)
    spent = _settle(run, tokens[0] + tokens[1], tokens[2], now)
    return spent or (then_call and not _cover_next(run, calls[-1], now))


def _settle(run: Run, tokens: int, cost: int, now: datetime) -> bool:
    """Move `tokens`/`cost` of the run's usage from its reservation to its budgets' usage."""
    held = run.budget
    if not held or held.get("released"):
        return False
    take_tokens, take_cost = min(tokens, held["tokens"]), min(cost, held["cost"])
    for budget_id, period in held["budgets"]:
        _roll(budget_id, period, now)
        Budget.objects.filter(pk=budget_id).update(
            used_tokens=F("used_tokens") + tokens,
            used_cost_micros=F("used_cost_micros") + cost,
            reserved_tokens=F("reserved_tokens") - take_tokens,
            reserved_cost_micros=F("reserved_cost_micros") - take_cost,
        )
    run.budget = {**held, "tokens": held["tokens"] - take_tokens, "cost": held["cost"] - take_cost}
    Run.objects.filter(pk=run.pk).update(budget=run.budget)
    return _spent(run)


def _next_call(run: Run, last: CallUsage) -> tuple[int, int]:
    """What the run's next model call is estimated to take: the last call's input and its reply sent
    again, and an answer of the output cap (tool results come on top: the estimate's known gap)."""
    out, input_price, output_price = (run.budget or {}).get("next") or [0, 0.0, 0.0]
    sent = last.input_tokens + last.output_tokens
    return sent + out, round(sent * input_price + out * output_price)


def _covered(run: Run, last: CallUsage) -> bool:
    held = run.budget or {}
    tokens, cost = _next_call(run, last)
    return bool(held.get("released")) or (held.get("tokens", 0) >= tokens and held.get("cost", 0) >= cost)


def _cover_next(run: Run, last: CallUsage, now: datetime) -> bool:
    """Top the run's reservation up to its next call's estimate before the call is made, atomically
    against every budget as admission does: False when a budget cannot take it (the run then
    stops, as if spent). So concurrent runs overspend only by their calls' estimation error, never
    by whole calls nobody reserved."""
    held = run.budget
    if not held or held.get("released") or _covered(run, last):
        return True
    tokens, cost = _next_call(run, last)
    more_tokens, more_cost = max(0, tokens - held["tokens"]), max(0, cost - held["cost"])
    try:
        with transaction.atomic():  # a savepoint: a refusal undoes this top-up only
            if _take(held["budgets"], more_tokens, more_cost, now) is not None:
                raise _Refused
    except _Refused:
        return False
    run.budget = {**held, "tokens": held["tokens"] + more_tokens, "cost": held["cost"] + more_cost}
    Run.objects.filter(pk=run.pk).update(budget=run.budget)
    return True


class _Refused(Exception):
    """A top-up a budget did not take (rolls its savepoint back)."""


def _spent(run: Run) -> bool:
    """Whether a budget the run counts against is spent (its usage at or over its limit)."""
    held = run.budget
    if not held or held.get("released"):
        return False
    ids = [budget_id for budget_id, _period in held["budgets"]]
    return (
        Budget.objects.filter(pk__in=ids)
        .filter(
            Q(max_tokens__isnull=False, used_tokens__gte=F("max_tokens"))
            | Q(max_cost_micros__isnull=False, used_cost_micros__gte=F("max_cost_micros"))
        )
        .exists()
    )


def release(run: Run) -> None:
    """The run ended: what it still holds of its reservation goes back to its budgets (once)."""
    held = run.budget
    if not held or held.get("released"):
        return
    for budget_id, _period in held["budgets"]:
        Budget.objects.filter(pk=budget_id).update(
            reserved_tokens=F("reserved_tokens") - held["tokens"],
            reserved_cost_micros=F("reserved_cost_micros") - held["cost"],
        )
    run.budget = {**held, "tokens": 0, "cost": 0, "released": True}
    Run.objects.filter(pk=run.pk).update(budget=run.budget)


def unknown_call(run: Run) -> CallUsage:
    """The call a run was making when its process died: its usage is unknown (recorded as such)."""
    last = UsageRecord.objects.filter(run_pk=run.pk).order_by("-step").values_list("step", flat=True).first()
    return CallUsage(step=(last or 0) + 1, unknown=True)
