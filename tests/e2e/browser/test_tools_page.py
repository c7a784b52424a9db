"""Tool cards and approvals on the chat page, driven as a person does (TOOLS.md §13, docs/browser.md).

The default `main` agent is the scripted agent with the built-in demo MCP server: a message with
`[[tool:demo.calculate {...}]]` runs a read-only tool at once, `[[tool:demo.add_note {...}]]` asks for
approval first. The suite's server gives the demo server a temporary notes folder (AGENTGATE_NOTES_DIR).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import Locator, Page, expect

from .server import GatewayServer

pytestmark = pytest.mark.browser

# The first tool call starts the demo MCP server (a Python subprocess): slow on a busy machine.
SLOW = 30_000


@pytest.fixture
def page(gateway_server: GatewayServer, open_page: Callable[..., Any], new_user: Callable[[], str]) -> Page:
    return open_page(gateway_server, new_user())  # type: ignore[no-any-return]


def tool(name: str, **args: str) -> str:
    return f"[[tool:{name} {json.dumps(args)}]]"


def send(page: Page, text: str) -> None:
    composer = page.get_by_test_id("composer")
    composer.fill(text)
    composer.press("Enter")


def cards(page: Page, state: str | None = None) -> Locator:
    selector = '[data-testid="tool-card"]'
    if state:
        selector += f'[data-state="{state}"]'
    return page.locator(selector)


def replies(page: Page, state: str | None = None) -> Locator:
    selector = '[data-testid="message"][data-role="assistant"]'
    if state:
        selector += f'[data-state="{state}"]'
    return page.locator(selector)


def open_row(page: Page) -> Locator:
    return page.locator('[data-testid="session-row"][data-current="true"]')


def expect_settled(card: Locator) -> None:
    """A card that has ended: no spinner, not busy, no open approval buttons."""
    expect(card.locator(".tool-spinner")).to_be_hidden()
    expect(card).not_to_have_attribute("aria-busy", "true")
    expect(card.get_by_test_id("approve")).to_be_hidden()
    expect(card.get_by_test_id("deny")).to_be_hidden()


def expect_result(card: Locator, text: str | re.Pattern[str]) -> None:
    """Open the card's result (collapsed) and check its text."""
    result = card.get_by_test_id("tool-result")
    expect(result).to_be_visible()
    pre = result.locator("pre")
    if result.get_attribute("open") is None:
        result.locator("summary").click()
    expect(result).to_have_attribute("open", "")
    expect(pre).to_be_visible()
    expect(pre).to_have_text(text)


def wait_for_approval(page: Page) -> Locator:
    """The card waiting for approval, with its prompt open; returns the card."""
    waiting = cards(page, "pending_approval")
    expect(waiting).to_have_count(1, timeout=SLOW)
    call_id = waiting.get_attribute("data-tool-call-id")
    assert call_id
    card = page.locator(f'[data-testid="tool-card"][data-tool-call-id="{call_id}"]')  # whatever its state
    prompt = card.get_by_test_id("tool-approval")
    expect(prompt).to_have_attribute("data-state", "pending")
    expect(prompt.get_by_test_id("approve")).to_have_text("Allow once")
    expect(prompt.get_by_test_id("deny")).to_have_text("Deny")
    expect(prompt.get_by_test_id("approve")).to_be_enabled()
    expect(prompt.get_by_test_id("approval-countdown")).to_have_text(re.compile(r"^\d+:\d\d left$"))
    expect(card.locator(".tool-spinner")).to_be_visible()
    return card


def test_read_only_tool_runs_at_once_and_its_card_survives_a_reload(page: Page) -> None:
    send(page, "What is six times seven? " + tool("demo.calculate", expression="6*7"))
    card = cards(page).first
    expect(cards(page)).to_have_count(1, timeout=SLOW)
    expect(card.get_by_test_id("tool-name")).to_have_text("demo.calculate")
    expect(card).to_have_attribute("data-state", "succeeded", timeout=SLOW)
    expect(card.get_by_test_id("tool-status")).to_have_text("Done")
    expect(card.get_by_test_id("tool-approval")).to_be_hidden()
    expect(card.get_by_test_id("tool-args").locator("pre")).to_contain_text('"expression": "6*7"')
    expect(card.get_by_test_id("tool-result").locator("summary")).to_contain_text("6*7 = 42")
    expect_result(card, "6*7 = 42")

    reply = replies(page, "final")
    expect(reply).to_have_text("echo: What is six times seven? 6*7 = 42", timeout=SLOW)
    expect(page.get_by_test_id("stop")).to_be_hidden()
    expect_settled(card)
    # The card comes before its reply.
    assert card.evaluate(
        "(c, r) => !!(c.compareDocumentPosition(r) & Node.DOCUMENT_POSITION_FOLLOWING)", reply.element_handle()
    )

    page.reload()
    expect(page.get_by_test_id("connection-status")).to_have_attribute("data-state", "online")
    expect(replies(page, "final")).to_have_text("echo: What is six times seven? 6*7 = 42")
    expect(cards(page)).to_have_count(1)
    card = cards(page, "succeeded")
    expect(card).to_have_count(1)
    expect(card.get_by_test_id("tool-name")).to_have_text("demo.calculate")
    expect_settled(card)
    expect_result(card, "6*7 = 42")
    # History's toolResult message is the card's outcome, never a bubble of its own.
    expect(page.locator('[data-testid="message"]')).to_have_count(2)


def test_allow_once_runs_the_tool_and_clears_the_needs_approval_badge(page: Page) -> None:
    send(page, "Remember this " + tool("demo.add_note", text="buy milk"))
    card = wait_for_approval(page)
    expect(card.get_by_test_id("tool-name")).to_have_text("demo.add_note")
    expect(card.get_by_test_id("tool-status")).to_have_text("Waiting for approval")
    row = open_row(page)
    expect(row).to_have_attribute("data-waiting", "approval")
    expect(row.locator(".row-status")).to_have_text("needs approval")
    expect(page.get_by_test_id("stop")).to_be_visible()

    card.get_by_test_id("approve").click()
    expect(card).to_have_attribute("data-state", "succeeded", timeout=SLOW)
    prompt = card.get_by_test_id("tool-approval")
    expect(prompt).to_have_attribute("data-state", "resolved")
    expect(prompt.get_by_test_id("approval-decision")).to_contain_text("Allowed once")
    expect(prompt.get_by_test_id("approval-countdown")).to_be_hidden()
    expect_result(card, "Saved note: buy milk")
    expect(replies(page, "final")).to_have_text("echo: Remember this Saved note: buy milk", timeout=SLOW)
    expect_settled(card)
    expect(row).not_to_have_attribute("data-waiting", "approval")
    expect(row.locator(".row-status")).not_to_have_text("needs approval")


def test_deny_ends_the_card_denied_and_the_reply_says_it_was_not_run(page: Page) -> None:
    send(page, "Remember that " + tool("demo.add_note", text="never saved"))
    card = wait_for_approval(page)
    expect(open_row(page)).to_have_attribute("data-waiting", "approval")

    card.get_by_test_id("deny").click()
    expect(card).to_have_attribute("data-state", "denied", timeout=SLOW)
    expect(card.get_by_test_id("tool-status")).to_have_text("Denied")
    expect(card.get_by_test_id("tool-approval").get_by_test_id("approval-decision")).to_contain_text("Denied")
    reply = replies(page, "final")
    expect(reply).to_contain_text("echo: Remember that Not run:", timeout=SLOW)
    expect(reply).to_contain_text("denied it")
    expect_settled(card)
    expect(card.get_by_test_id("tool-result")).not_to_contain_text("Saved note")
    expect(open_row(page)).not_to_have_attribute("data-waiting", "approval")


def test_stop_while_an_approval_is_pending_cancels_the_call(page: Page) -> None:
    send(page, "Save it " + tool("demo.add_note", text="stopped before a decision"))
    card = wait_for_approval(page)

    page.get_by_test_id("stop").click()
    expect(card).to_have_attribute("data-state", re.compile(r"^(cancelled|ended)$"), timeout=SLOW)
    expect(card.get_by_test_id("tool-status")).to_have_text(re.compile(r"^(Cancelled|Ended with the run)$"))
    expect(page.get_by_test_id("stop")).to_be_hidden()
    expect(replies(page, "aborted")).to_have_count(1)
    expect(open_row(page)).to_have_attribute("data-status", "killed")
    expect(open_row(page)).not_to_have_attribute("data-waiting", "approval")
    expect_settled(card)
    prompt = card.get_by_test_id("tool-approval")
    expect(prompt).not_to_have_attribute("data-state", re.compile(r"^(pending|sending)$"))
    expect(prompt.get_by_test_id("approval-countdown")).to_be_hidden()
    # The gateway's outcome arrives in the end: the call was cancelled, never run.
    expect(card).to_have_attribute("data-state", "cancelled", timeout=SLOW)
    expect(card.get_by_test_id("tool-result")).not_to_contain_text("Saved note")


HOSTILE = '<img src=x onerror="window.__pwned=1"> <b>bold</b>'


def test_html_in_a_tool_result_stays_text(page: Page) -> None:
    send(page, "Note " + tool("demo.add_note", text=HOSTILE) + " " + tool("demo.list_notes"))
    card = wait_for_approval(page)
    card.get_by_test_id("approve").click()
    expect(cards(page, "succeeded")).to_have_count(2, timeout=SLOW)
    added, listed = cards(page).nth(0), cards(page).nth(1)
    expect(added.get_by_test_id("tool-name")).to_have_text("demo.add_note")
    expect(listed.get_by_test_id("tool-name")).to_have_text("demo.list_notes")
    expect_result(added, f"Saved note: {HOSTILE}")
    expect_result(listed, re.compile(re.escape(HOSTILE)))
    expect(added.get_by_test_id("tool-args").locator("pre")).to_contain_text(
        '<img src=x onerror=\\"window.__pwned=1\\">'
    )
    expect(replies(page, "final")).to_contain_text("Saved note:", timeout=SLOW)

    for card_ in (added, listed):
        expect(card_.locator("img")).to_have_count(0)
        expect(card_.locator("b")).to_have_count(0)
    expect(page.locator("#message-list img")).to_have_count(0)
    assert page.evaluate("document.querySelectorAll('img[src=x], img[onerror]').length") == 0
    assert page.evaluate("typeof window.__pwned") == "undefined"

    page.reload()
    expect(page.get_by_test_id("connection-status")).to_have_attribute("data-state", "online")
    expect(cards(page, "succeeded")).to_have_count(2)
    expect_result(cards(page).nth(0), f"Saved note: {HOSTILE}")
    assert page.evaluate("document.querySelectorAll('img[src=x], img[onerror]').length") == 0
    assert page.evaluate("typeof window.__pwned") == "undefined"
