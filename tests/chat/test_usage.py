"""Usage recorded once per model call, and budgets that hold (docs/usage.md), through the real consumer.

The model is the fake OpenAI-compatible server (it reports the usage it charges, `FakeOpenAI.charged`)
or the scripted backend (its word counts stand in for tokens).
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.test import Client
from django.utils import timezone

from chat.httpapi.app import HttpApi
from sessions_app.lifecycle import runs
from sessions_app.lifecycle.usage import forget_budget_check
from sessions_app.models import ApiToken, Budget, BudgetScope, ChatSession, Run, RunState, ToolCall, UsageRecord
from sessions_app.operations.prune import prune_sessions
from tests.chat.test_httpapi_app import chat, inner, post
from tests.chat.test_ops import samples
from tests.support.communicator import open_client
from tests.support.db import send_params
from tests.support.fake_openai import FakeOpenAI, Reply, ToolCallReply, agent_config, tool_reply
from tests.support.tools import TOOL_CONNECT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

LLM = "agent:llm:chat"
PRICES = {"fake-model": {"input_per_mtok": 2, "output_per_mtok": 10}}


@pytest.fixture
def llm(settings: Any, fake: FakeOpenAI, tmp_path: Path) -> dict[str, Any]:
    """Agent `llm`: the fake model with prices, and the demo MCP server."""
    demo = {**settings.DEMO_MCP_SERVER, "env": {"AGENTGATE_NOTES_DIR": str(tmp_path)}}
    config = agent_config(fake, model="fake-model", prices=PRICES, mcp_servers={"demo": demo})
    settings.GATEWAY_AGENTS = {**settings.GATEWAY_AGENTS, "llm": config}
    return config


@pytest.fixture
async def tool_client(alice: tuple[Any, str], llm: dict[str, Any]) -> Any:
    c = await open_client(alice[1], params=TOOL_CONNECT)
    yield c
    await c.close()


def calc(expression: str) -> ToolCallReply:
    return ToolCallReply("demo__calculate", json.dumps({"expression": expression}), id="call_a", pieces=2)


@database_sync_to_async
def rows(run_id: str) -> list[UsageRecord]:
    return list(UsageRecord.objects.filter(run_id=run_id).order_by("step"))


@database_sync_to_async
def session_row(key: str) -> ChatSession:
    return ChatSession.objects.get(key=key)


@database_sync_to_async
def session_gone_check(pk: int) -> bool:
    return ChatSession.objects.filter(pk=pk).exists()


@database_sync_to_async
def make_budget(**values: Any) -> Budget:
    return Budget.objects.create(**values)


@database_sync_to_async
def fresh(budget: Budget) -> Budget:
    return Budget.objects.get(pk=budget.pk)


async def send(client: Any, key: str, run_id: str, message: str, timeout: float = 30) -> dict[str, Any]:
    return await client.call("chat.send", send_params(key, message, run_id), timeout)


# --- usage ----------------------------------------------------------------------------------------------


async def test_each_model_call_of_a_tool_run_is_recorded_once_with_its_cost(tool_client, fake):
    fake.push(
        tool_reply(
            calc("6*7"),
            chunks=["Let me see."],
            usage={"prompt_tokens": 20, "completion_tokens": 9},
            cached_tokens=5,
            reasoning_tokens=3,
        ),
        Reply(chunks=["42."], usage={"prompt_tokens": 40, "completion_tokens": 4}),
    )
    assert (await send(tool_client, LLM, "r1", "6*7?"))["payload"]["status"] == "started"
    final = await tool_client.wait_terminal("r1", timeout=30)
    assert final["state"] == "final"

    first, second = await rows("r1")
    assert (first.step, first.input_tokens, first.output_tokens, first.cached_tokens, first.reasoning_tokens) == (
        1,
        20,
        9,
        5,
        3,
    )
    assert (second.step, second.input_tokens, second.output_tokens) == (2, 40, 4)
    assert (first.model, first.agent_id, first.estimated, first.unknown) == ("fake-model", "llm", False, False)
    # USD 2 / 10 per million tokens: millionths of a dollar per token
    assert (first.cost_micros, second.cost_micros) == (20 * 2 + 9 * 10, 40 * 2 + 4 * 10)
    # what the gateway recorded is what the model charged
    assert [(r.input_tokens, r.output_tokens) for r in (first, second)] == [
        (c["prompt_tokens"], c["completion_tokens"]) for c in fake.charged
    ]
    session = await session_row(LLM)
    assert (session.total_input_tokens, session.total_output_tokens, session.total_cost_micros) == (60, 13, 250)


async def test_a_step_retried_after_a_backend_fault_is_counted_once(tool_client, fake):
    fake.push(Reply(status=503), Reply(chunks=["fine"], usage={"prompt_tokens": 7, "completion_tokens": 2}))
    await send(tool_client, LLM, "r1", "hello")
    assert (await tool_client.wait_terminal("r1", timeout=30))["state"] == "final"
    assert len(fake.requests) == 2
    (row,) = await rows("r1")
    assert (row.step, row.input_tokens, row.output_tokens) == (1, 7, 2)


async def test_a_model_that_reports_no_usage_is_estimated_and_marked(tool_client, fake):
    fake.push(Reply(chunks=["Hello", " there!"]))
    await send(tool_client, LLM, "r1", "hi")
    assert (await tool_client.wait_terminal("r1", timeout=30))["state"] == "final"
    (row,) = await rows("r1")
    assert row.estimated and row.output_tokens == 3 and row.input_tokens > 0  # "Hello there!": 12 chars


async def test_a_call_cut_by_its_processes_death_is_recorded_unknown_and_its_reservation_released(
    client, alice, settings
):
    settings.GATEWAY_BUDGET_OUTPUT_TOKENS = 10
    budget = await make_budget(scope=BudgetScope.USER, user=alice[0], max_tokens=1000, period="total")
    await send(client, "s", "r1", "[[hang]] hi")
    await client.drain(0.3)
    assert (await fresh(budget)).reserved_tokens > 0

    run = await database_sync_to_async(Run.objects.get)(run_id="r1")
    # what recovery does for the runs of a process that died (`recovery`)
    assert await database_sync_to_async(runs.interrupt_run)(run.pk, message="its process died")
    (row,) = await rows("r1")
    assert row.unknown and row.step == 1 and row.input_tokens == row.output_tokens == 0
    after = await fresh(budget)
    assert (after.reserved_tokens, after.used_tokens) == (0, 0)


async def test_usage_outlives_the_pruned_transcript(client):
    await send(client, "s", "r1", "[[tick:0]] one two")
    await client.wait_terminal("r1")
    await client.drain(0.2)
    session = await session_row("agent:main:s")
    await database_sync_to_async(ChatSession.objects.filter(pk=session.pk).update)(
        updated_at=timezone.now() - timedelta(days=30)
    )
    result = await database_sync_to_async(prune_sessions)(older_than_days=1, broadcast=False)
    assert result.sessions == 1 and not await session_gone_check(session.pk)
    (row,) = await rows("r1")
    assert row.session_pk == session.pk and row.output_tokens > 0


# --- budgets --------------------------------------------------------------------------------------------


async def test_a_send_over_budget_is_refused_and_admits_nothing_until_the_budget_is_raised(client, alice, settings):
    settings.GATEWAY_BUDGET_OUTPUT_TOKENS = 50
    budget = await make_budget(name="alice monthly", scope=BudgetScope.USER, user=alice[0], max_tokens=40)
    answer = await send(client, "new", "k1", "hello")
    assert not answer["ok"]
    ack = answer["payload"]
    assert (ack["status"], ack["errorKind"], ack["budget"], ack["runId"]) == ("error", "budget", "alice monthly", "k1")
    assert ack["resetsAt"] and "alice monthly" in ack["summary"]
    assert answer["error"]["code"] == "RATE_LIMITED" and answer["error"]["details"]["reason"] == "insufficient_quota"
    # nothing admitted: no run, no session, no reservation left behind
    assert not await database_sync_to_async(Run.objects.filter(run_id="k1").exists)()
    assert not await database_sync_to_async(ChatSession.objects.filter(key="agent:main:new").exists)()
    assert (await fresh(budget)).reserved_tokens == 0

    # an operator raises the budget: the same key goes through
    await database_sync_to_async(Budget.objects.filter(pk=budget.pk).update)(max_tokens=10_000)
    # (an update() sends no signal; the admin's save does, and is seen at once: as here)
    forget_budget_check()
    ack = (await send(client, "new", "k1", "[[tick:0]] hello"))["payload"]
    assert ack["status"] == "started"
    await client.wait_terminal("k1")
    await client.drain(0.2)
    after = await fresh(budget)
    assert after.reserved_tokens == 0 and after.used_tokens == 2 + 2  # scripted: words in, "echo: hello" out


async def test_a_spent_budget_resets_at_its_period_boundary(client, alice, settings):
    settings.GATEWAY_BUDGET_OUTPUT_TOKENS = 10
    yesterday = timezone.now() - timedelta(days=1)
    budget = await make_budget(
        scope=BudgetScope.USER, user=alice[0], max_tokens=100, period="day", used_tokens=100, period_start=yesterday
    )
    ack = (await send(client, "s", "r1", "[[tick:0]] hi"))["payload"]
    assert ack["status"] == "started"  # yesterday's spending is over
    await client.wait_terminal("r1")
    await client.drain(0.2)
    after = await fresh(budget)
    assert after.used_tokens == 2 + 2 and after.period_start > yesterday


async def test_concurrent_sends_never_overspend_by_more_than_one_reservation(client, alice, settings):
    settings.GATEWAY_BUDGET_OUTPUT_TOKENS = 20
    message = "[[tick:0]] a b c d"  # reserved: 5 (prompt) + 20; spends 5 in + 6 out
    budget = await make_budget(scope=BudgetScope.USER, user=alice[0], max_tokens=100, period="total")
    answers = await asyncio.gather(*(send(client, f"s{i}", f"r{i}", message) for i in range(20)))
    admitted = [a["payload"]["runId"] for a in answers if a["ok"]]
    refused = [a["payload"]["runId"] for a in answers if not a["ok"]]
    assert admitted and refused
    assert all(a["payload"]["errorKind"] == "budget" for a in answers if not a["ok"])
    for run_id in admitted:
        await client.wait_terminal(run_id, 20)
    await client.drain(0.3)
    after = await fresh(budget)
    reservation = 5 + 20
    assert after.reserved_tokens == 0
    assert after.used_tokens <= after.max_tokens + reservation
    assert after.used_tokens == sum([r.input_tokens + r.output_tokens for r in await all_rows()])
    ran = set(await database_sync_to_async(lambda: list(Run.objects.values_list("run_id", flat=True)))())
    assert ran == set(admitted)  # the refused admitted nothing


@database_sync_to_async
def all_rows() -> list[UsageRecord]:
    return list(UsageRecord.objects.all())


@pytest.mark.parametrize(
    ("limit", "prompt", "completion"),
    [
        # the estimate fits; the first call's real usage does not (210 of 200: spent)
        (200, 150, 60),
        # the first call takes 80 (80 of 150: not spent), but the next call would send those 80 again
        # with an answer of up to 10: 80 + 90 > 150, so it is not made
        (150, 60, 20),
    ],
    ids=["spent", "next-call-does-not-fit"],
)
async def test_a_run_stops_before_its_next_tool_when_its_budget_cannot_take_the_next_call(
    tool_client, fake, alice, settings, limit, prompt, completion
):
    settings.GATEWAY_BUDGET_OUTPUT_TOKENS = 10
    budget = await make_budget(scope=BudgetScope.AGENT, agent_id="llm", max_tokens=limit, period="total")
    fake.push(
        tool_reply(calc("1+1"), chunks=["Thinking."], usage={"prompt_tokens": prompt, "completion_tokens": completion}),
        Reply(chunks=["never asked"]),
    )
    await send(tool_client, LLM, "r1", "1+1?")
    final = await tool_client.wait_terminal("r1", timeout=30)
    assert (final["state"], final["stopReason"]) == ("final", "budget"), final
    assert len(fake.requests) == 1  # the model is not asked again
    assert not await database_sync_to_async(ToolCall.objects.exists)()  # and no tool started
    after = await fresh(budget)
    assert (after.used_tokens, after.reserved_tokens) == (prompt + completion, 0)
    assert (await database_sync_to_async(Run.objects.get)(run_id="r1")).state == RunState.DONE


async def test_a_send_is_reserved_its_conversation_so_far_not_only_its_own_text(tool_client, fake, alice, settings):
    settings.GATEWAY_BUDGET_OUTPUT_TOKENS = 10
    budget = await make_budget(scope=BudgetScope.AGENT, agent_id="llm", max_tokens=400, period="total")
    fake.push(Reply(chunks=["A long answer."], usage={"prompt_tokens": 150, "completion_tokens": 60}))
    await send(tool_client, LLM, "r1", "tell me")
    assert (await tool_client.wait_terminal("r1", timeout=30))["state"] == "final"
    assert (await fresh(budget)).used_tokens == 210
    # The next turn sends those 210 again: its own text (2) and the output cap (10) alone would fit
    # the 190 left, the conversation with them does not. Refused, nothing admitted.
    answer = await send(tool_client, LLM, "r2", "and then?")
    assert not answer["ok"] and answer["payload"]["errorKind"] == "budget", answer
    assert not await database_sync_to_async(Run.objects.filter(run_id="r2").exists)()
    after = await fresh(budget)
    assert (after.used_tokens, after.reserved_tokens) == (210, 0)
    # a new session has no conversation to send: it fits
    fake.push(Reply(chunks=["ok"], usage={"prompt_tokens": 5, "completion_tokens": 1}))
    assert (await send(tool_client, "agent:llm:other", "r3", "hi"))["payload"]["status"] == "started"
    assert (await tool_client.wait_terminal("r3", timeout=30))["state"] == "final"
    # nor has a reset transcript (the old one is not sent again)
    await tool_client.ok("sessions.reset", {"key": LLM})
    fake.push(Reply(chunks=["ok"], usage={"prompt_tokens": 5, "completion_tokens": 1}))
    assert (await send(tool_client, LLM, "r4", "fresh start"))["payload"]["status"] == "started"
    assert (await tool_client.wait_terminal("r4", timeout=30))["state"] == "final"


async def test_the_agents_system_prompt_is_reserved_with_every_send(tool_client, fake, alice, settings, llm):
    # the system prompt goes with every call: 400 characters are 100 tokens of it, over the 100 left
    settings.GATEWAY_AGENTS = {**settings.GATEWAY_AGENTS, "llm": {**llm, "system_prompt": "Be brief. " * 40}}
    settings.GATEWAY_BUDGET_OUTPUT_TOKENS = 10
    await make_budget(scope=BudgetScope.AGENT, agent_id="llm", max_tokens=100, period="total")
    answer = await send(tool_client, LLM, "r1", "hi")
    assert not answer["ok"] and answer["payload"]["errorKind"] == "budget", answer
    assert not fake.requests


async def test_a_run_whose_budget_covers_its_next_call_goes_on_to_make_it(tool_client, fake, alice, settings):
    settings.GATEWAY_BUDGET_OUTPUT_TOKENS = 10
    budget = await make_budget(scope=BudgetScope.AGENT, agent_id="llm", max_tokens=1000, period="total")
    fake.push(
        tool_reply(calc("1+1"), chunks=["Thinking."], usage={"prompt_tokens": 60, "completion_tokens": 20}),
        Reply(chunks=["2."], usage={"prompt_tokens": 95, "completion_tokens": 2}),
    )
    await send(tool_client, LLM, "r1", "1+1?")
    final = await tool_client.wait_terminal("r1", timeout=30)
    assert (final["state"], final.get("stopReason")) == ("final", "stop"), final
    run = await database_sync_to_async(Run.objects.get)(run_id="r1")
    assert run.budget["released"] and run.budget["tokens"] == 0
    after = await fresh(budget)
    assert (after.used_tokens, after.reserved_tokens) == (80 + 97, 0)


async def test_a_last_step_needs_no_room_for_a_call_it_will_not_make(tool_client, fake, alice, settings, llm):
    # at max_steps the model is not asked again: the budget need not cover another call, so the
    # step's tool runs and the run ends `tool_limit`, not `budget`
    settings.GATEWAY_AGENTS = {**settings.GATEWAY_AGENTS, "llm": {**llm, "max_steps": 1}}
    settings.GATEWAY_BUDGET_OUTPUT_TOKENS = 10
    budget = await make_budget(scope=BudgetScope.AGENT, agent_id="llm", max_tokens=150, period="total")
    fake.push(tool_reply(calc("1+1"), chunks=["Thinking."], usage={"prompt_tokens": 60, "completion_tokens": 20}))
    await send(tool_client, LLM, "r1", "1+1?")
    final = await tool_client.wait_terminal("r1", timeout=30)
    assert (final["state"], final["stopReason"]) == ("final", "tool_limit"), final
    assert await database_sync_to_async(ToolCall.objects.filter(state="succeeded").count)() == 1
    after = await fresh(budget)
    assert (after.used_tokens, after.reserved_tokens) == (80, 0)


async def test_max_run_tokens_caps_one_run(tool_client, fake, settings, llm):
    settings.GATEWAY_AGENTS = {**settings.GATEWAY_AGENTS, "llm": {**llm, "max_run_tokens": 50}}
    fake.push(tool_reply(calc("1+1"), usage={"prompt_tokens": 40, "completion_tokens": 20}), Reply(chunks=["no"]))
    await send(tool_client, LLM, "r1", "1+1?")
    final = await tool_client.wait_terminal("r1", timeout=30)
    assert final["stopReason"] == "budget" and len(fake.requests) == 1


async def test_over_http_a_spent_budget_of_the_api_key_is_429_insufficient_quota(alice, settings):
    token = await database_sync_to_async(lambda: ApiToken.objects.get(user=alice[0]))()
    await make_budget(name="key cap", scope=BudgetScope.API_KEY, api_token=token, max_tokens=1, period="week")
    request, exchange = post("/v1/chat/completions", alice[1], chat("hello", stream=False))
    await HttpApi(inner)(request, exchange.receive, exchange.send)
    error = json.loads(exchange.body)["error"]
    assert exchange.status == 429 and error["code"] == "insufficient_quota" and "key cap" in error["message"]
    assert not await database_sync_to_async(Run.objects.exists)()


# --- seeing it ------------------------------------------------------------------------------------------


async def test_usage_status_and_sessions_usage_answer_in_openclaws_shapes(tool_client, fake, alice, settings):
    settings.GATEWAY_BUDGET_OUTPUT_TOKENS = 10
    await make_budget(name="alice tokens", scope=BudgetScope.USER, user=alice[0], max_tokens=1000, period="month")
    fake.push(Reply(chunks=["ok"], usage={"prompt_tokens": 100, "completion_tokens": 50}, cached_tokens=30))
    await send(tool_client, LLM, "r1", "hi")
    await tool_client.wait_terminal("r1", timeout=30)
    await tool_client.drain(0.2)

    status = await tool_client.ok("usage.status")
    (provider,) = status["providers"]
    (window,) = provider["windows"]
    assert window["label"] == "alice tokens" and window["usedPercent"] == 15.0 and window["resetAt"] > 0

    usage = await tool_client.ok("sessions.usage", {})
    (row,) = usage["sessions"]
    assert row["key"] == LLM and row["agentId"] == "llm" and row["model"] == "fake-model"
    assert (row["usage"]["input"], row["usage"]["output"], row["usage"]["cacheRead"]) == (100, 50, 30)
    assert row["usage"]["totalCost"] == pytest.approx((100 * 2 + 50 * 10) / 1e6)
    assert usage["totals"]["totalTokens"] == 150 and usage["totals"]["missingCostEntries"] == 0
    (by_model,) = usage["aggregates"]["byModel"]
    assert (by_model["model"], by_model["count"], by_model["totals"]["totalTokens"]) == ("fake-model", 1, 150)
    (day,) = usage["aggregates"]["daily"]
    assert day["tokens"] == 150 and day["date"] == usage["endDate"]
    bad = await tool_client.call("sessions.usage", {"startDate": "yesterday"})
    assert not bad["ok"] and bad["error"]["code"] == "INVALID_REQUEST"


async def test_metrics_export_tokens_and_cost_by_agent_and_model(tool_client, fake):
    def scrape() -> dict[Any, float]:
        return samples(Client().get("/metrics").content.decode())

    def value(found: dict[Any, float], name: str, **labels: str) -> float:
        return found.get((name, tuple(sorted(labels.items()))), 0.0)

    before = await database_sync_to_async(scrape)()
    fake.push(Reply(chunks=["ok"], usage={"prompt_tokens": 100, "completion_tokens": 50}))
    await send(tool_client, LLM, "r1", "hi")
    await tool_client.wait_terminal("r1", timeout=30)
    await tool_client.drain(0.2)
    after = await database_sync_to_async(scrape)()
    tokens = "agentgate_model_tokens_total"
    labels = {"agent": "llm", "model": "fake-model"}
    assert value(after, tokens, kind="input", **labels) - value(before, tokens, kind="input", **labels) == 100
    assert value(after, tokens, kind="output", **labels) - value(before, tokens, kind="output", **labels) == 50
    cost = value(after, "agentgate_model_cost_usd_total", **labels) - value(
        before, "agentgate_model_cost_usd_total", **labels
    )
    assert cost == pytest.approx((100 * 2 + 50 * 10) / 1e6)


def test_the_page_shows_usage_left_and_warns_at_80_percent(client_page_user):
    user, page = client_page_user
    Budget.objects.create(name="month", scope=BudgetScope.USER, user=user, max_tokens=1000, period="month")
    html = page.get("/").content.decode()
    assert 'data-testid="budget"' in html and "0.0% used, 1000 tokens left" in html and "budget-warn" not in html
    Budget.objects.filter(user=user).update(used_tokens=850, period_start=timezone.now())
    html = page.get("/").content.decode()
    assert "budget-warn" in html and "85.0% used, 150 tokens left" in html


@pytest.fixture
def client_page_user(make_user):
    user, _token = make_user("pageuser")
    page = Client()
    page.force_login(user)
    return user, page
