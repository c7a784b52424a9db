"""The API keys page in Chromium: make a key from the chat page's link, see it once (and copy it),
use it on the WebSocket, revoke it through the confirm dialog: its open connection is closed."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from .server import GatewayServer

pytestmark = pytest.mark.browser

# Opens the gateway's WebSocket with `key` as `auth.token`; resolves with the `connect` answer (or
# the close code). The socket stays open in `window.keySocketClosed` (its close code, when it closes).
CONNECT_WITH_KEY = """
(key) => new Promise((resolve) => {
  const ws = new WebSocket(`ws://${location.host}/ws/gateway`);
  window.keySocketClosed = new Promise((closed) => ws.addEventListener("close", (e) => closed(e.code)));
  ws.addEventListener("close", (e) => resolve({ closed: e.code }));
  ws.addEventListener("message", (m) => {
    const frame = JSON.parse(m.data);
    if (frame.event === "connect.challenge") {
      const client = { id: "keys-test", version: "1" };
      const params = { minProtocol: 4, maxProtocol: 4, client, auth: { token: key } };
      ws.send(JSON.stringify({ type: "req", id: "c1", method: "connect", params }));
    } else if (frame.type === "res" && frame.id === "c1") {
      resolve(frame);
    }
  });
})
"""


def test_make_a_key_see_it_once_use_it_and_revoke_it(
    gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]
) -> None:
    page: Page = open_page(gateway_server, new_user())
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.get_by_test_id("api-keys-link").click()
    page.wait_for_url(f"{gateway_server.base_url}/api/keys")
    expect(page.get_by_test_id("no-keys")).to_be_visible()
    expect(page.get_by_test_id("scope-admin")).to_have_count(0)  # not staff: no admin to give

    page.get_by_test_id("key-name").fill("laptop script")
    page.get_by_test_id("scope-approvals").uncheck()
    page.get_by_test_id("create-key").click()
    expect(page.get_by_test_id("new-key")).to_contain_text("will not be shown again")
    raw = page.get_by_test_id("new-key-value").input_value()
    assert raw.startswith("agt_")
    page.get_by_test_id("copy-key").click()
    expect(page.get_by_test_id("copy-status")).to_contain_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == raw
    row = page.get_by_test_id("key-row")
    expect(row).to_have_count(1)
    expect(row).to_have_attribute("data-prefix", raw[:12])
    expect(row).to_contain_text("read, write")
    expect(row).to_contain_text("never")  # not used yet

    # the key works, within its scopes, on a socket that stays open in a second tab
    socket_page = page.context.new_page()
    socket_page.goto(f"{gateway_server.base_url}/api/keys")
    hello = socket_page.evaluate(CONNECT_WITH_KEY, raw)
    assert hello["ok"] is True, hello
    assert hello["payload"]["auth"]["scopes"] == ["operator.read", "operator.write"]

    # shown once: the list, loaded again, has its prefix and never the key
    page.goto(f"{gateway_server.base_url}/api/keys")
    expect(page.get_by_test_id("new-key")).to_have_count(0)
    assert raw not in page.content()
    expect(page.get_by_test_id("key-row")).to_contain_text(f"{raw[:12]}…")
    expect(page.get_by_test_id("key-row")).not_to_contain_text("never")  # the socket's connect is its last use

    # revoke: a question first; Cancel keeps the key, Revoke ends it and its open socket
    page.get_by_test_id("revoke-key").click()
    dialog = page.get_by_test_id("dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("“laptop script”")
    page.get_by_test_id("dialog-cancel").click()
    expect(dialog).to_be_hidden()
    expect(page.get_by_test_id("key-row")).to_have_attribute("data-state", "active")
    page.get_by_test_id("revoke-key").click()
    expect(page.get_by_test_id("dialog-confirm")).to_have_text("Revoke")
    page.get_by_test_id("dialog-confirm").click()
    expect(page.get_by_test_id("keys-message")).to_contain_text(f"Revoked {raw[:12]}… (laptop script)")
    expect(page.get_by_test_id("key-row")).to_have_attribute("data-state", "revoked")
    expect(page.get_by_test_id("revoke-key")).to_have_count(0)
    assert socket_page.evaluate("window.keySocketClosed") == 4008
    refused = socket_page.evaluate(CONNECT_WITH_KEY, raw)
    assert refused.get("error", {}).get("code") == "UNAUTHORIZED", refused
    socket_page.close()


def test_at_phone_width_the_keys_page_is_in_the_menu_and_fits(
    gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]
) -> None:
    page: Page = open_page(gateway_server, new_user(), viewport={"width": 390, "height": 844})
    expect(page.get_by_test_id("api-keys-link")).to_be_hidden()  # no room in the header
    page.get_by_test_id("toggle-sidebar").click()
    page.get_by_test_id("api-keys-menu-link").click()
    page.wait_for_url(f"{gateway_server.base_url}/api/keys")
    page.get_by_test_id("key-name").fill("a phone's key with a long name to see that nothing overflows")
    page.get_by_test_id("create-key").click()
    expect(page.get_by_test_id("new-key-value")).to_have_value(re.compile(r"^agt_"))
    assert page.evaluate("document.documentElement.scrollWidth") <= 390, "no sideways scrolling at phone width"
    box = page.get_by_test_id("copy-key").bounding_box()
    assert box and box["x"] + box["width"] <= 390
