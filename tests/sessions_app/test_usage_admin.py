"""Usage and budgets for operators: the admin's budgets and summaries (with CSV), and `usage_report`."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from sessions_app.models import Budget, BudgetScope, UsageRecord

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff() -> Client:
    user = get_user_model().objects.create_user(username="op", password="pw-12345678", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def usage(owner: Any) -> list[UsageRecord]:
    """Usage of two users on two days, over two agents and models (one call unpriced, one unknown)."""
    bob = get_user_model().objects.create_user(username="bob", password="pw-12345678")
    today = timezone.now()
    made = []
    for i, (user, agent, model, day, tokens, cost) in enumerate(
        [
            (owner, "main", "m1", 0, (10, 5), 100),
            (owner, "main", "m1", 1, (20, 10), 200),
            (owner, "llm", "m2", 0, (1, 1), None),
            (bob, "llm", "m2", 0, (100, 50), 1_000_000),
        ]
    ):
        when = today - dt.timedelta(days=day)
        made.append(
            UsageRecord.objects.create(
                run_pk=i + 1,
                step=1,
                user=user,
                agent_id=agent,
                model=model,
                input_tokens=tokens[0],
                output_tokens=tokens[1],
                cost_micros=cost,
                day=when.date(),
                created_at=when,
            )
        )
    UsageRecord.objects.create(
        run_pk=99, step=2, user=owner, agent_id="main", model="m1", unknown=True, day=today.date(), created_at=today
    )
    return made


def test_the_summary_sums_by_each_grouping_and_exports_csv(staff: Client, usage: list[UsageRecord]) -> None:
    page = staff.get("/admin/sessions_app/usagerecord/summary/", {"group": "user"})
    assert page.status_code == 200
    rows = {r["user__username"]: r for r in page.context["rows"]}
    assert rows["owner"]["tokens"] == 47 and rows["owner"]["calls"] == 4 and rows["owner"]["cost_usd"] == 0.0003
    assert rows["bob"]["tokens"] == 150 and rows["bob"]["cost_usd"] == 1.0

    exported = staff.get("/admin/sessions_app/usagerecord/summary/", {"group": "model", "format": "csv"})
    assert exported["Content-Type"] == "text/csv"
    table = list(csv.DictReader(io.StringIO(exported.content.decode())))
    by_model = {(r["agent_id"], r["model"]): r for r in table}
    assert by_model[("main", "m1")]["tokens"] == "45" and by_model[("main", "m1")]["unknown"] == "1"
    assert by_model[("llm", "m2")]["tokens"] == "152"

    today = staff.get(
        "/admin/sessions_app/usagerecord/summary/",
        {"group": "day", "start": timezone.now().date().isoformat()},
    )
    (row,) = today.context["rows"]
    assert row["tokens"] == 15 + 2 + 150
    assert staff.get("/admin/sessions_app/usagerecord/").status_code == 200
    assert staff.get("/admin/sessions_app/budget/").status_code == 200


def test_saving_a_budget_in_the_admin_never_writes_its_counters(staff: Client, owner: Any) -> None:
    budget = Budget.objects.create(scope=BudgetScope.USER, user=owner, max_tokens=100, period="month")
    form = staff.get(f"/admin/sessions_app/budget/{budget.pk}/change/")
    assert form.status_code == 200
    # a run reserves meanwhile, and another settles
    Budget.objects.filter(pk=budget.pk).update(reserved_tokens=25, used_tokens=40)
    saved = staff.post(
        f"/admin/sessions_app/budget/{budget.pk}/change/",
        {"name": "raised", "scope": "user", "user": owner.pk, "period": "month", "max_tokens": 1000, "enabled": "on"},
    )
    assert saved.status_code == 302, saved.content[:2000]
    budget.refresh_from_db()
    assert (budget.name, budget.max_tokens, budget.reserved_tokens, budget.used_tokens) == ("raised", 1000, 25, 40)


def test_usage_report_for_a_period_as_json_and_csv(
    usage: list[UsageRecord], capsys: pytest.CaptureFixture[str]
) -> None:
    today = timezone.now().date()
    call_command("usage_report", "--start", today.isoformat(), "--end", today.isoformat(), "--by", "agent")
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert (report["start"], report["by"]) == (today.isoformat(), "agent")
    rows = {r["agent_id"]: r for r in report["rows"]}
    assert rows["main"]["tokens"] == 15 and rows["main"]["unknown"] == 1
    assert rows["llm"]["tokens"] == 152 and rows["llm"]["cost_usd"] == 1.0
    assert "usage_report" in err

    call_command(
        "usage_report", "--start", (today - dt.timedelta(days=1)).isoformat(), "--format", "csv", "--by", "day"
    )
    out, _err = capsys.readouterr()
    days = list(csv.DictReader(io.StringIO(out)))
    assert [d["tokens"] for d in days] == ["30", "167"]
