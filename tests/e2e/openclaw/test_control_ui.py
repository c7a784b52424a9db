"""OpenClaw's Control UI (the package's own `dist/control-ui`, unchanged) in Chromium, against a
real server.

The UI's files are served from a loopback HTTP server of their own, as an operator would host
them, so the page's origin differs from the gateway's: the gateway lists it in
GATEWAY_ALLOWED_ORIGINS (docs/protocol-notes.md, "OpenClaw's Control UI"). The page is pointed at
the gateway the way its "Switch to this Gateway" confirmation does it, and gets the token in the
URL fragment. One page for the module: a streamed reply, Stop, a failing run, /status, /think,
/model and /new; after each step no error on the page, no duplicated turn, no Stop button left
once the run is over, and the server agreeing. Each test stands on its own (test workers may
split the module).
"""

from __future__ import annotations

import importlib.util
import os
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.browser.server import CHROMIUM, launched_chromium
from tests.e2e.openclaw.conftest import OpenClawServer, need
from tests.support.openclaw import Gateway, OpenClaw, StaticSite, control_ui_seed, error_lines, wait_for

pytestmark = [pytest.mark.server, pytest.mark.browser, pytest.mark.timeout(300)]

MAIN = "agent:main:main"
FAILURE = "scripted agent failed mid-stream"
STOP = re.compile(r"^(stop|stop generating|stop run|abort)$", re.IGNORECASE)


@pytest.fixture(scope="module")
def user(oc_server: OpenClawServer) -> Gateway:
    return oc_server.user("occontrol")


@pytest.fixture(scope="module")
def site(openclaw: OpenClaw, oc_server: OpenClawServer) -> Iterator[StaticSite]:
    served = StaticSite(openclaw.control_ui, oc_server.site_port)
    yield served
    served.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    need(os.path.exists(CHROMIUM), f"{CHROMIUM} is needed for the Control UI (apt-get install chromium)")
    need(importlib.util.find_spec("playwright") is not None, "the playwright package is needed for the Control UI")
    with launched_chromium() as chromium:
        yield chromium


class ControlUi:
    """The page and what it reported (uncaught errors, console errors, failed requests)."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.errors: list[str] = []
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        page.on("console", lambda msg: msg.type == "error" and self.errors.append(f"console: {msg.text}"))

    def pane(self) -> Any:
        """The chat pane in front (the page keeps the panes of sessions it showed before)."""
        active = self.page.locator("openclaw-chat-pane.chat-pane-cache__pane--active")
        return active.first if active.count() else self.page.locator("openclaw-chat-pane").first

    def pane_text(self) -> str:
        try:
            return str(self.pane().inner_text(timeout=2000))
        except Exception as exc:  # the pane is re-rendered; report what was there
            return f"(no chat pane: {exc})"

    def turns(self) -> list[str]:
        """The texts of the conversation's message groups, oldest first (what a reader sees once)."""
        return [str(t) for t in self.pane().locator(".chat-group").all_inner_texts()]

    def count_turns(self, text: str) -> int:
        return sum(text in turn for turn in self.turns())

    def body_text(self) -> str:
        return str(self.page.locator("body").inner_text())

    def dump(self) -> str:
        return f"{self.body_text()}\n--- page errors ---\n" + "\n".join(self.errors[-20:])

    def composer(self) -> Any:
        return self.page.get_by_role("textbox", name="Chat composer")

    def stop_button(self) -> Any:
        return self.page.get_by_role("button", name=STOP)

    def send(self, text: str) -> None:
        box = self.composer()
        box.click()
        box.fill(text)
        box.press("Enter")
        # a slash command's menu may take the first Enter to pick the command
        try:
            wait_for(lambda: box.input_value() == "", timeout=2, what="the composer to send")
        except AssertionError:
            box.press("Enter")
            wait_for(lambda: box.input_value() == "", timeout=5, what="the composer to send", dump=self.dump)

    def wait_pane(self, text: str, timeout: float = 15) -> str:
        return wait_for(
            lambda: (t := self.pane_text()) and text in t and t,
            timeout=timeout,
            what=f"the chat pane to show {text!r}",
            dump=self.dump,
        )

    def wait_idle(self, timeout: float = 15) -> None:
        wait_for(lambda: self.stop_button().count() == 0, timeout=timeout, what="the Stop button to go", dump=self.dump)

    def check(self, *, allowed: tuple[str, ...] = ()) -> str:
        """No error on the page or in its console; the chat pane not blank."""
        text = self.pane_text()
        assert text.strip(), f"the chat pane is blank\n{self.dump()}"
        bad = error_lines(self.body_text(), allowed=allowed)
        assert not bad, f"error lines on the page: {bad}\n{self.dump()}"
        assert not self.errors, f"errors in the page: {self.errors[:10]}"
        return text


@pytest.fixture(scope="module")
def ui(browser: Any, site: StaticSite, oc_server: OpenClawServer, user: Gateway) -> Iterator[ControlUi]:
    gateway_ws = f"ws://127.0.0.1:{oc_server.server.port}"
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(10_000)
    context.add_init_script(control_ui_seed(site.origin, gateway_ws, MAIN))
    # the gateway's own Control UI config is not part of the package's files
    context.route("**/control-ui-config.json", lambda route: route.fulfill(status=200, json={}))
    page = context.new_page()
    control = ControlUi(page)
    page.goto(f"{site.origin}/#token={user.token}")
    try:
        wait_for(lambda: control.composer().count() > 0, timeout=30, what="the chat composer", dump=control.dump)
        yield control
    finally:
        context.close()


@pytest.fixture(autouse=True)
def _leave_nothing_running(user: Gateway) -> Iterator[None]:
    """A failed step must not poison the next one: end whatever it left open (after its checks)."""
    yield
    for row in user.busy():
        user.call("chat.abort", {"sessionKey": row["key"]})


def test_chat_page_loads_without_errors(ui: ControlUi) -> None:
    wait_for(lambda: "Connected" in ui.body_text(), timeout=15, what="the page connected", dump=ui.dump)
    ui.check()
    # the effort picker shows the agent's default level (`defaults.thinkingDefault`), not "Unknown"
    wait_for(lambda: "Off" in ui.body_text(), timeout=10, what="the effort picker to say Off", dump=ui.dump)
    assert "Unknown" not in ui.body_text(), ui.dump()


def test_streamed_reply(ui: ControlUi, user: Gateway) -> None:
    words = "cui-stream alpha beta gamma delta epsilon zeta eta theta iota kappa"
    reply = f"echo: {words}"
    ui.send(f"{words} [[tick:150]]")
    wait_for(
        lambda: "echo: cui-stream" in (t := ui.pane_text()) and reply not in t,
        timeout=15,
        what="part of the reply in the pane while it streams",
        dump=ui.dump,
    )
    ui.wait_pane(reply)
    ui.wait_idle()
    ui.check()
    assert ui.count_turns(reply) == 1, f"the reply is not shown exactly once: {ui.turns()}"
    assert ui.count_turns(f"{words} [[tick:150]]") == 1, f"the message is not shown exactly once: {ui.turns()}"
    user.wait_row(MAIN, lambda r: r["status"] == "done", "the run done")
    user.assert_idle()


def test_stop_interrupts_the_run(ui: ControlUi, user: Gateway) -> None:
    ui.send("cui-abort [[tick:200]] [[words:300]]")
    ui.wait_pane("word3")
    ui.stop_button().first.click()
    ui.wait_pane("Interrupted")
    ui.wait_idle()
    text = ui.check()
    assert "word300" not in text
    assert ui.count_turns("cui-abort [[tick:200]] [[words:300]]") == 1, ui.turns()
    row = user.wait_row(MAIN, lambda r: r["status"] == "killed" and not r["hasActiveRun"], "the run killed")
    assert row["abortedLastRun"] is True
    user.assert_idle()


def test_failure_is_shown_and_nothing_spins(ui: ControlUi, user: Gateway) -> None:
    ui.send("cui-fail [[fail:stream]] [[tick:50]]")
    ui.wait_pane(FAILURE)
    ui.wait_idle()
    ui.check(allowed=(FAILURE,))
    user.wait_row(MAIN, lambda r: r["status"] == "failed" and not r["hasActiveRun"], "the run failed")
    user.assert_idle()


def test_status_is_the_gateways_answer(ui: ControlUi, user: Gateway) -> None:
    ui.send("/status")
    wait_for(
        lambda: MAIN in (t := ui.pane_text()) or "echo: /status" in t,
        timeout=15,
        what="an answer to /status",
        dump=ui.dump,
    )
    ui.wait_idle()
    text = ui.check(allowed=(FAILURE,))
    assert "echo: /status" not in text, f"/status went to the agent instead of the gateway:\n{text}"
    assert MAIN in text and "scripted" in text, f"/status does not show the session and its model:\n{text}"
    # the answer comes twice on the wire (the `chat` final, then the ack's `reply`) and is in
    # history: shown once, also after the page has re-read it
    time.sleep(1.0)
    assert ui.count_turns(f"Session {MAIN} (sessionId") == 1, f"/status answered more than once: {ui.turns()}"
    user.assert_idle()


def test_think_high_persists(ui: ControlUi, user: Gateway) -> None:
    ui.send("/think high")
    user.wait_row(MAIN, lambda r: r.get("thinkingLevel") == "high", "thinkingLevel high stored")
    ui.wait_idle()
    ui.check(allowed=(FAILURE,))


def test_model_offers_and_takes_a_choice(ui: ControlUi, user: Gateway) -> None:
    ui.send("/model")
    ui.wait_pane("scripted-alt")  # the choices: the agent's models
    ui.send("/model scripted-alt")
    user.wait_row(MAIN, lambda r: r.get("model") == "scripted-alt", "the model choice stored")
    ui.wait_idle()
    ui.check(allowed=(FAILURE,))


def test_typing_during_a_run_steers_it(ui: ControlUi, user: Gateway) -> None:
    """The page sends `queueMode: "steer"` while a run streams: the message is sent (not "Not
    sent"). The scripted agent takes no steering (docs/protocol-notes.md, "Steering"): the message
    waits as a follow-up, the streaming run finishes, then the new message is answered, once each."""
    first = "cui-steer first [[tick:30]] [[words:60]]"
    streamed = ui.pane_text().count("echo: word1 word2")  # earlier turns may hold the same words
    ui.send(first)
    wait_for(
        lambda: ui.pane_text().count("echo: word1 word2") > streamed,
        timeout=15,
        what="the first reply streaming",
        dump=ui.dump,
    )
    ui.send("cui-steer change of plan")
    ui.wait_pane("echo: cui-steer change of plan")
    ui.wait_idle()
    text = ui.check()
    assert "Not sent" not in text, f"the message typed during the run was not sent:\n{text}"
    assert "word60" in text  # the first run was not stopped
    assert ui.count_turns("echo: cui-steer change of plan") == 1, ui.turns()
    assert ui.count_turns(first) == 1, ui.turns()
    row = user.wait_row(MAIN, lambda r: r["status"] == "done" and not r["hasActiveRun"], "the follow-up done")
    history = user.call("chat.history", {"sessionKey": MAIN, "limit": 4})["messages"]
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"], history
    assert not any(m.get("aborted") for m in history), history
    assert history[-1]["content"][0]["text"] == "echo: cui-steer change of plan", history
    assert row["lastRunId"] == history[-1]["runId"]
    user.assert_idle()


def test_fork_from_a_user_message_opens_a_new_session_with_the_branch_before_it(ui: ControlUi, user: Gateway) -> None:
    """The Control UI's "Fork from here" (`sessions.fork`): a new session holding the conversation before
    the message, opened, its composer seeded with the message."""
    for text in ("cui-fork one", "cui-fork two"):
        ui.send(text)
        ui.wait_pane(f"echo: {text}")
        ui.wait_idle()
    history = user.call("chat.history", {"sessionKey": MAIN, "limit": 20})["messages"]
    two = [m for m in history if m["role"] == "user" and m["content"][0]["text"] == "cui-fork two"][-1]
    before = {r["key"] for r in user.rows()}
    target = ui.pane().locator(f'[data-entry-id="{two["id"]}"]').first
    wait_for(lambda: target.count() > 0, timeout=10, what="the message's entry in the pane", dump=ui.dump)
    target.click(button="right")
    ui.page.get_by_text("Fork from here", exact=True).first.click()
    wait_for(
        lambda: ui.composer().input_value() == "cui-fork two",
        timeout=15,
        what="the composer seeded with the message",
        dump=ui.dump,
    )
    new = [r for r in user.rows() if r["key"] not in before]
    assert len(new) == 1, new
    forked = user.call("chat.history", {"sessionKey": new[0]["key"], "limit": 50})["messages"]
    said = [(m["role"], m["content"][0]["text"]) for m in forked if m["role"] in ("user", "assistant")]
    assert said[-2:] == [("user", "cui-fork one"), ("assistant", "echo: cui-fork one")], said
    ui.composer().fill("")
    ui.check()
    user.assert_idle()


def test_new_gives_a_fresh_session(ui: ControlUi, user: Gateway) -> None:
    before = {r["key"]: r["sessionId"] for r in user.rows()}
    ui.send("/new")

    def fresh() -> bool:
        now = {r["key"]: r["sessionId"] for r in user.rows()}
        return any(k not in before or before[k] != sid for k, sid in now.items())

    wait_for(fresh, timeout=15, what="a new session (a new key or a new sessionId) on the server", dump=ui.dump)
    wait_for(lambda: "cui-stream alpha" not in ui.pane_text(), timeout=15, what="the old turns gone", dump=ui.dump)
    ui.send("cui-fresh hello")
    ui.wait_pane("echo: cui-fresh hello")
    ui.wait_idle()
    ui.check()
    assert ui.count_turns("echo: cui-fresh hello") == 1, ui.turns()
    user.assert_idle()


def test_nothing_left_running_and_no_errors(ui: ControlUi, user: Gateway) -> None:
    user.assert_idle()
    assert not ui.errors, f"errors in the page: {ui.errors[:10]}"
