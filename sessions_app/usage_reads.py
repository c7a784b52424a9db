"""Reads of usage and budgets (docs/usage.md): a user's budgets with their state, and usage rolled up by
session, model, agent and day from the usage rows (indexed by user and day)."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from django.db.models import Count, Max, Min, Q, Sum
from django.utils import timezone

from sessions_app.lifecycle.usage import applicable, period_end, period_start
from sessions_app.models import Budget, ChatSession, UsageRecord


@dataclass
class BudgetState:
    """One budget as a user sees it: what is used, held by running runs, left, and when it resets."""

    budget: Budget
    used_tokens: int
    used_cost_micros: int
    resets_at: datetime | None

    @property
    def used_fraction(self) -> float:
        """The larger of its token and cost use, as a fraction of its limit (0 for no limit)."""
        parts = []
        if self.budget.max_tokens:
            parts.append(self.used_tokens / self.budget.max_tokens)
        if self.budget.max_cost_micros:
            parts.append(self.used_cost_micros / self.budget.max_cost_micros)
        return max(parts, default=0.0)

    def as_json(self) -> dict[str, Any]:
        b = self.budget
        return {
            "id": b.pk,
            "name": str(b),
            "scope": b.scope,
            "period": b.period,
            "maxTokens": b.max_tokens,
            "usedTokens": self.used_tokens,
            "reservedTokens": b.reserved_tokens,
            "remainingTokens": None if b.max_tokens is None else max(0, b.max_tokens - self.used_tokens),
            "maxCost": None if b.max_cost_micros is None else b.max_cost_micros / 1e6,
            "usedCost": self.used_cost_micros / 1e6,
            "remainingCost": None
            if b.max_cost_micros is None
            else max(0, b.max_cost_micros - self.used_cost_micros) / 1e6,
            "usedPercent": round(self.used_fraction * 100, 1),
            "resetsAt": self.resets_at.isoformat() if self.resets_at else None,
        }


def budget_states(owner_id: int, agent_id: str = "", api_token_id: int | None = None) -> list[BudgetState]:
    """The budgets that apply to this user's sends (to `agent_id`, by `api_token_id`), as of now: a
    budget whose period has ended reads as reset, though its row resets at its next send."""
    now = timezone.now()
    states = []
    for budget in applicable(owner_id, agent_id, api_token_id):
        start = period_start(budget.period, now)
        stale = start is not None and (budget.period_start is None or budget.period_start < start)
        used, cost = (0, 0) if stale else (budget.used_tokens, budget.used_cost_micros)
        states.append(BudgetState(budget, used, cost, period_end(budget.period, now)))
    return states


def usage_rows(user_id: int | None, start: date, end: date, **filters: Any) -> Any:
    """The usage rows of a user (all users: None) from `start` to `end` (days, inclusive)."""
    rows = UsageRecord.objects.filter(day__gte=start, day__lte=end, **filters)
    return rows if user_id is None else rows.filter(user_id=user_id)


TOTALS = {
    "input": Sum("input_tokens"),
    "output": Sum("output_tokens"),
    "cached": Sum("cached_tokens"),
    "reasoning": Sum("reasoning_tokens"),
    "cost": Sum("cost_micros"),
    "calls": Count("id"),
}


def rollup(rows: Any, *by: str) -> list[dict[str, Any]]:
    """Totals of the rows grouped by the fields `by` (one GROUP BY over the indexed rows)."""
    return list(rows.values(*by).annotate(**TOTALS, first=Min("created_at"), last=Max("created_at")).order_by(*by))


def sessions_of(pks: list[int]) -> dict[int, ChatSession]:
    return {s.pk: s for s in ChatSession.objects.filter(pk__in=pks)}


# what a summary groups by (the admin's and `usage_report`'s)
GROUPINGS = {"user": ("user__username",), "agent": ("agent_id",), "model": ("agent_id", "model"), "day": ("day",)}
SUMMARY_FIELDS = ("calls", "input", "output", "cached", "reasoning", "tokens", "cost_usd", "estimated", "unknown")


def summary_rows(start: date, end: date, by: tuple[str, ...]) -> list[dict[str, Any]]:
    """Usage of all users from `start` to `end` summed by the fields `by`, with tokens and cost in USD."""
    rows = usage_rows(None, start, end)
    out = list(
        rows.values(*by)
        .annotate(
            **TOTALS,
            estimated=Count("id", filter=Q(estimated=True)),
            unknown=Count("id", filter=Q(unknown=True)),
        )
        .order_by(*by)
    )
    for row in out:
        row["tokens"] = (row["input"] or 0) + (row["output"] or 0)
        row["cost_usd"] = None if row["cost"] is None else row["cost"] / 1e6
        row["keys_shown"] = [row[c] for c in by]
    return out


def write_summary_csv(out: Any, rows: list[dict[str, Any]], by: tuple[str, ...]) -> None:
    writer = csv.writer(out)
    writer.writerow([*by, *SUMMARY_FIELDS])
    for row in rows:
        writer.writerow([*(row[c] for c in by), *("" if row[f] is None else row[f] for f in SUMMARY_FIELDS)])
