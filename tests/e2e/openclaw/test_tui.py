"""OpenClaw's terminal UI (`openclaw tui`, pinned, unchanged) against a real server, in tmux.

One TUI process for the module, driven like a person at the keyboard (send-keys) and read
from the screen (capture-pane): a streamed reply, Esc to abort, a failing run, /status,
/think, /model and /new. After each step the screen must show no error line, no duplicated
turn and no spinner once the run is over, and the server must agree (sessions.list, health).
The tests share the module's TUI, as one session at the keyboard would, and each stands on its
own (test workers may split the module).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.openclaw.conftest import OpenClawServer, need
from tests.support.openclaw import Gateway, OpenClaw, Tui, error_lines, wait_for

pytestmark = [pytest.mark.server, pytest.mark.timeout(300)]

MAIN = "agent:main:main"
FAILURE = "scripted agent failed mid-stream"


@pytest.fixture(scope="module")
def user(oc_server: OpenClawServer) -> Gateway:
    return oc_server.user("octui")


@pytest.fixture(scope="module")
def tui(
    openclaw: OpenClaw, oc_server: OpenClawServer, user: Gateway, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Tui]:
    need(shutil.which("tmux") is not None, "tmux is needed to drive OpenClaw's TUI (apt-get install tmux)")
    workdir: Path = tmp_path_factory.mktemp("tui")
    terminal = Tui(openclaw, oc_server.ws_url, user.token, workdir)
    try:
        terminal.wait_text(f"session {MAIN}", timeout=60)
        terminal.wait_settled("idle", timeout=30)
        yield terminal
    finally:
        terminal.close()


@pytest.fixture(autouse=True)
def _leave_nothing_running(user: Gateway) -> Iterator[None]:
    """A failed step must not poison the next one: end whatever it left open (after its checks)."""
    yield
    for row in user.busy():
        user.call("chat.abort", {"sessionKey": row["key"]})


def step(tui: Tui, marker: str, *, allowed: tuple[str, ...] = ()) -> str:
    """The screen from `marker` on, checked: something shown, no error line."""
    screen = tui.screen()
    assert screen.strip(), "the TUI's screen is blank"
    part = tui.since(marker)
    assert part, f"{marker!r} is not on the screen:\n{screen}"
    bad = error_lines(part, allowed=allowed)
    assert not bad, f"error lines on the TUI's screen: {bad}\n--- screen ---\n{screen}"
    return part


def shows_after(tui: Tui, act: Callable[[], None], shows: str, *, what: str, timeout: float = 15) -> None:
    """Do `act` and wait for `shows` to appear once more on the screen; then the screen must show
    no error line."""
    before = tui.screen().count(shows)
    act()
    shown = f"{what} to show {shows!r}"
    wait_for(lambda: tui.screen().count(shows) > before, timeout=timeout, what=shown, dump=tui.dump)
    screen = tui.screen()
    bad = error_lines(screen, allowed=(FAILURE,))
    assert not bad, f"error lines on the TUI's screen after {what}: {bad}\n--- screen ---\n{screen}"


def command(tui: Tui, text: str, shows: str) -> None:
    """A slash command the TUI handles itself (it is not echoed as a message): see `shows_after`."""
    shows_after(tui, lambda: tui.submit(text), shows, what=repr(text))


def test_connects_without_errors(tui: Tui) -> None:
    screen = tui.screen()
    assert "gateway connected" in screen or "connected | idle" in screen, screen
    assert not error_lines(screen), f"errors on the TUI's first screen:\n{screen}"


def test_streamed_reply(tui: Tui, user: Gateway) -> None:
    message = "tui-stream alpha beta gamma delta epsilon zeta eta theta iota kappa [[tick:150]]"
    reply = "echo: tui-stream alpha beta gamma delta epsilon zeta eta theta iota kappa"
    tui.submit(message)

    def partly_there() -> str | None:
        part = tui.since(message)
        return part if "echo: tui-stream" in part and reply not in part else None

    wait_for(partly_there, timeout=15, what="part of the reply on screen while it streams", dump=tui.dump)
    tui.wait_text(reply, after=message)
    tui.wait_settled("idle")
    part = step(tui, message)
    assert part.count(reply) == 1, f"the reply is shown more than once:\n{part}"
    assert tui.screen().count(message) == 1, f"the message is shown more than once:\n{tui.screen()}"
    user.wait_row(MAIN, lambda r: r["status"] == "done" and not r["hasActiveRun"], "the run done")
    user.assert_idle()


def test_escape_aborts_the_run(tui: Tui, user: Gateway) -> None:
    message = "tui-abort [[tick:200]] [[words:300]]"
    tui.submit(message)
    tui.wait_text("word3", after=message)
    tui.press("Escape")
    tui.wait_text("run aborted", after=message)
    tui.wait_settled("aborted")
    part = step(tui, message)
    assert "word300" not in part
    row = user.wait_row(MAIN, lambda r: r["status"] == "killed" and not r["hasActiveRun"], "the run killed")
    assert row["abortedLastRun"] is True
    user.assert_idle()


def test_failure_is_shown_and_nothing_spins(tui: Tui, user: Gateway) -> None:
    message = "tui-fail [[fail:stream]] [[tick:100]]"
    tui.submit(message)
    tui.wait_text(FAILURE, after=message)
    tui.wait_settled("error")
    step(tui, message, allowed=(FAILURE, "connected | error"))
    user.wait_row(MAIN, lambda r: r["status"] == "failed" and not r["hasActiveRun"], "the run failed")
    user.assert_idle()


def test_status_is_the_gateways_answer(tui: Tui, user: Gateway) -> None:
    tui.submit("/status")

    def answered() -> str | None:
        part = tui.since("/status")
        return part if MAIN in part or "echo: /status" in part else None

    wait_for(answered, timeout=15, what="an answer to /status", dump=tui.dump)
    tui.wait_settled("idle")
    part = step(tui, "/status")
    assert "echo: /status" not in part, f"/status went to the agent instead of the gateway:\n{part}"
    assert MAIN in part and "scripted" in part, f"/status does not show the session and its model:\n{part}"
    # the answer comes as a `chat` final and again in history (re-read after the ack): shown once
    answer = f"Session {MAIN} (sessionId"
    time.sleep(1.0)  # let the re-read after the ack land: a second copy could only come after it
    assert step(tui, "/status").count(answer) == 1, f"/status answered more than once:\n{tui.since('/status')}"
    user.assert_idle()


def test_think_high_persists(tui: Tui, user: Gateway) -> None:
    command(tui, "/think high", "thinking set to high")
    user.wait_row(MAIN, lambda r: r.get("thinkingLevel") == "high", "thinkingLevel high stored")


def test_model_picker_offers_the_agents_models(tui: Tui, user: Gateway) -> None:
    command(tui, "/model", "scripted/scripted-alt")  # the picker lists the agent's models
    tui.type("alt")  # the picker's search
    shows_after(tui, lambda: tui.press("Enter"), "model set to scripted/scripted-alt", what="picking scripted-alt")
    user.wait_row(MAIN, lambda r: r.get("model") == "scripted-alt", "the model choice stored")


def test_new_gives_a_fresh_session(tui: Tui, user: Gateway) -> None:
    before = {r["key"] for r in user.rows()}
    main_before = user.row(MAIN)
    command(tui, "/new", "new session: agent:main:tui-")
    fresh = wait_for(
        lambda: [r for r in user.rows() if r["key"] not in before],
        timeout=10,
        what="a new session on the server",
    )
    assert len(fresh) == 1 and fresh[0]["key"].startswith("agent:main:tui-"), fresh
    key = fresh[0]["key"]
    message = "tui-fresh hello"
    tui.submit(message)
    tui.wait_text("echo: tui-fresh hello", after=message)
    tui.wait_settled("idle")
    part = step(tui, message)
    assert part.count("echo: tui-fresh hello") == 1, part
    assert "tui-stream alpha" not in tui.screen(), f"the old conversation is still on screen:\n{tui.screen()}"
    user.wait_row(key, lambda r: r["status"] == "done", "the new session's run done")
    main_after = user.row(MAIN)
    assert main_before is not None and main_after is not None
    kept = ("sessionId", "lastRunId", "status")
    changed = {k: (main_before[k], main_after[k]) for k in kept if main_before[k] != main_after[k]}
    assert not changed, f"the turn in the new session changed the old one: {changed}"


def test_nothing_left_running_and_no_errors(tui: Tui, user: Gateway) -> None:
    assert not tui.dead(), tui.dump()
    user.assert_idle()
    bad = error_lines(tui.history(), allowed=(FAILURE, "connected | error"))
    assert not bad, f"error lines in the TUI's whole session: {bad}"
