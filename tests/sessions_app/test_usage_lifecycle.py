"""`lifecycle.usage` through the lifecycle services (no socket): a step recorded once however often its
write is tried, settlement and release, the period's boundary, a group's budget."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group

from sessions_app.lifecycle import runs
from sessions_app.lifecycle.usage import CallUsage, Estimate, period_end, period_start
from sessions_app.models import Budget, BudgetScope, ChatSession, RunState, UsageRecord
from tests.support.db import admit_send, send_request

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_step_written_twice_is_counted_once_and_settles_its_reservation(owner: Any) -> None:
    budget = Budget.objects.create(scope=BudgetScope.USER, user=owner, max_tokens=100, period="total")
    run = admit_send(owner, "r1", estimate=Estimate(tokens=40)).run
    assert run is not None and run.budget["tokens"] == 40
    budget.refresh_from_db()
    assert (budget.reserved_tokens, budget.used_tokens) == (40, 0)

    call = CallUsage(step=1, model="m", input_tokens=30, output_tokens=50)
    # (then_call=False: the run's last step; a run that means to ask again must cover that call, below)
    assert runs.record_step(run.pk, call, then_call=False) is False  # 80 of 100
    # the same step again (a write retried): nothing more
    assert runs.record_step(run.pk, call, then_call=False) is False
    assert UsageRecord.objects.filter(run_pk=run.pk).count() == 1
    budget.refresh_from_db()
    assert (budget.reserved_tokens, budget.used_tokens) == (0, 80)  # the reservation's 40 became usage
    # a next call would send those 80 again (160 of 100): a run that means to make one must stop
    assert runs.record_step(run.pk, call) is True
    budget.refresh_from_db()
    assert (budget.reserved_tokens, budget.used_tokens) == (0, 80)  # nothing reserved for it
    second = CallUsage(step=2, model="m", input_tokens=10, output_tokens=15)
    assert runs.record_step(run.pk, second, then_call=False) is True  # 105 of 100: spent, the run must stop
    assert runs.record_step(run.pk, second, then_call=False) is True  # and a retry finds it so again
    assert runs.finish_run(run.pk, RunState.DONE, owner_process="", reply="x", streamed=True)
    budget.refresh_from_db()
    assert (budget.reserved_tokens, budget.used_tokens) == (0, 105)
    session = ChatSession.objects.get(pk=run.session_id)
    assert (session.total_input_tokens, session.total_output_tokens) == (40, 65)


def test_a_groups_budget_is_shared_by_its_members_and_refuses_with_its_reset(owner: Any, make_user: Any) -> None:
    team = Group.objects.create(name="team")
    other, _ = make_user("other")
    team.user_set.add(owner, other)
    Budget.objects.create(name="team", scope=BudgetScope.GROUP, group=team, max_tokens=50, period="week")
    assert admit_send(owner, "r1", estimate=Estimate(tokens=30)).admission == "started"
    # 60 of 50 with the first one's reservation
    refused = runs.admit_send(send_request(other.pk, "r2", estimate=Estimate(tokens=30)), owner_process="")
    assert refused.admission == "budget" and refused.run is None
    assert refused.over_budget is not None and refused.over_budget.name == "team"
    assert refused.over_budget.resets_at == period_end("week", datetime.now(UTC))
    assert not ChatSession.objects.filter(owner=other).exists()


def test_periods_start_and_end_on_their_utc_boundaries() -> None:
    now = datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC)  # a Thursday
    assert period_start("day", now) == datetime(2026, 12, 31, tzinfo=UTC)
    assert period_end("day", now) == datetime(2027, 1, 1, tzinfo=UTC)
    assert period_start("week", now) == datetime(2026, 12, 28, tzinfo=UTC)
    assert period_end("week", now) == datetime(2027, 1, 4, tzinfo=UTC)
    assert period_end("month", now) == datetime(2027, 1, 1, tzinfo=UTC)
    assert period_start("total", now) is None and period_end("total", now) is None
    assert period_start("day", now + timedelta(seconds=1)) == datetime(2027, 1, 1, tzinfo=UTC)


def test_a_new_user_gets_the_default_budget_at_their_first_send(owner: Any, settings: Any) -> None:
    settings.GATEWAY_DEFAULT_USER_BUDGET = {"max_tokens": 50, "max_cost_usd": 0.001, "period": "day"}
    assert admit_send(owner, "r1", estimate=Estimate(tokens=30)).admission == "started"
    (budget,) = Budget.objects.filter(user=owner)
    assert (budget.name, budget.max_tokens, budget.max_cost_micros, budget.period) == ("default", 50, 1000, "day")
    assert admit_send(owner, "r2", key="agent:main:other", estimate=Estimate(tokens=30)).admission == "budget"
    assert Budget.objects.filter(user=owner).count() == 1  # created once


def test_a_cost_budget_refuses_what_its_price_would_take_over(owner: Any) -> None:
    Budget.objects.create(name="dollars", scope=BudgetScope.USER, user=owner, max_cost_micros=1000, period="month")
    assert admit_send(owner, "r1", estimate=Estimate(tokens=10, cost_micros=600)).admission == "started"
    over = admit_send(owner, "r2", key="agent:main:b", estimate=Estimate(tokens=10, cost_micros=600))
    assert over.admission == "budget" and over.over_budget is not None and over.over_budget.name == "dollars"
    # unpriced calls cost nothing against it
    assert admit_send(owner, "r3", key="agent:main:c", estimate=Estimate(tokens=10)).admission == "started"
