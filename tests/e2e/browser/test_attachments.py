"""Attaching files on the chat page (docs/files.md), in Chromium: by the button, by paste and by
drag-and-drop; previews in the composer and in the transcript; upload progress; a failed upload says
why and keeps the message; a message with an attachment in the outbox survives a reload."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.support import files as made

from .server import GatewayServer

pytestmark = pytest.mark.browser

PNG = made.png(40, 30)

# Make a File in the page from base64 and hand it to the page as a paste or a drop.
JS_FILE = "(b64, name, type) => new File([Uint8Array.from(atob(b64), c => c.charCodeAt(0))], name, { type })"


def chips(page: Page) -> Any:
    return page.get_by_test_id("composer-attachments").get_by_test_id("attachment-chip")


def user_messages(page: Page) -> Any:
    return page.locator('[data-testid="message"][data-role="user"]')


def replies(page: Page) -> Any:
    return page.locator('[data-testid="message"][data-role="assistant"][data-state="final"]')


def test_attach_by_button_preview_send_and_see_it_in_the_transcript(
    gateway_server: GatewayServer, open_page: Any, new_user: Any
) -> None:
    page = open_page(gateway_server, new_user())
    page.get_by_test_id("attach-input").set_input_files([{"name": "chart.png", "mimeType": "image/png", "buffer": PNG}])
    chip = chips(page).first
    expect(chip).to_have_attribute("data-state", "done")
    expect(chip).to_contain_text(re.compile(r"chart\.png · \d+ B"))
    expect(chip.get_by_test_id("attachment-thumb")).to_be_visible()
    page.get_by_test_id("composer").fill("what is this?")
    page.get_by_test_id("composer").press("Enter")
    expect(replies(page).last).to_have_text("echo: what is this? (+1 attachment)", timeout=15_000)
    expect(chips(page)).to_have_count(0)
    thumb = user_messages(page).last.get_by_test_id("attachment-thumb")
    expect(thumb).to_be_visible()
    page.wait_for_function("img => img.complete && img.naturalWidth === 40", arg=thumb.element_handle())
    # after a reload the message comes from history, with its file
    page.reload()
    expect(replies(page).last).to_have_text("echo: what is this? (+1 attachment)", timeout=15_000)
    kept = user_messages(page).last
    expect(kept.get_by_test_id("attachment-chip")).to_contain_text(re.compile(r"chart\.png · \d+ B"))
    thumb = kept.get_by_test_id("attachment-thumb")
    expect(thumb).to_be_visible()
    page.wait_for_function("img => img.complete && img.naturalWidth === 40", arg=thumb.element_handle())


def test_paste_and_drop_attach_files_and_an_image_alone_can_be_sent(
    gateway_server: GatewayServer, open_page: Any, new_user: Any
) -> None:
    page = open_page(gateway_server, new_user())
    page.evaluate(
        f"""([b64]) => {{
            const file = ({JS_FILE})(b64, "pasted.png", "image/png");
            const data = new DataTransfer();
            data.items.add(file);
            const ev = new ClipboardEvent("paste", {{ clipboardData: data, bubbles: true, cancelable: true }});
            document.querySelector('[data-testid="composer"]').dispatchEvent(ev);
        }}""",
        [base64.b64encode(PNG).decode()],
    )
    page.evaluate(
        f"""([b64]) => {{
            const file = ({JS_FILE})(b64, "notes.md", "text/markdown");
            const data = new DataTransfer();
            data.items.add(file);
            const form = document.getElementById("composer-form");
            form.dispatchEvent(new DragEvent("dragover", {{ dataTransfer: data, bubbles: true, cancelable: true }}));
            form.dispatchEvent(new DragEvent("drop", {{ dataTransfer: data, bubbles: true, cancelable: true }}));
        }}""",
        [base64.b64encode(b"# Notes\nthe tide is at noon\n").decode()],
    )
    expect(chips(page)).to_have_count(2)
    expect(chips(page).nth(0)).to_have_attribute("data-state", "done")
    expect(chips(page).nth(1)).to_have_attribute("data-state", "done")
    expect(chips(page).nth(1)).to_contain_text("notes.md")
    expect(page.get_by_test_id("send")).to_be_enabled()  # files alone make a message
    page.get_by_test_id("send").click()
    expect(replies(page).last).to_have_text(re.compile(r"\(\+2 attachments\)\s*$"), timeout=15_000)
    expect(user_messages(page).last.get_by_test_id("attachment-chip")).to_have_count(2)


def test_upload_progress_shows_while_a_slow_upload_goes(
    gateway_server: GatewayServer, open_page: Any, new_user: Any
) -> None:
    page = open_page(gateway_server, new_user())
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send(
        "Network.emulateNetworkConditions",
        {"offline": False, "latency": 20, "downloadThroughput": -1, "uploadThroughput": 64 * 1024},
    )
    big = b"line of a long document\n" * 12_000  # ~290 KB: a few seconds at 64 KB/s
    page.get_by_test_id("attach-input").set_input_files([{"name": "long.txt", "mimeType": "text/plain", "buffer": big}])
    progress = chips(page).first.get_by_test_id("upload-progress")
    expect(progress).to_be_visible()
    expect(page.get_by_test_id("send")).to_be_disabled()
    expect(page.get_by_test_id("composer-status")).to_have_text("Uploading…")
    midway = (
        "() => { const p = document.querySelector('[data-testid=\"upload-progress\"]');"
        " return p && p.value > 0 && p.value < 1; }"
    )
    page.wait_for_function(midway)
    cdp.send(
        "Network.emulateNetworkConditions",
        {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
    )
    expect(chips(page).first).to_have_attribute("data-state", "done", timeout=20_000)


def test_a_failed_upload_says_why_and_keeps_the_message(
    gateway_server: GatewayServer, open_page: Any, new_user: Any
) -> None:
    page = open_page(gateway_server, new_user())
    page.get_by_test_id("composer").fill("please look at this")
    fake_png = b"\x89PNG\r\n\x1a\n" + b"not an image at all" * 10
    page.get_by_test_id("attach-input").set_input_files(
        [{"name": "broken.png", "mimeType": "image/png", "buffer": fake_png}]
    )
    chip = chips(page).first
    expect(chip).to_have_attribute("data-state", "failed")
    expect(chip.get_by_test_id("upload-error")).to_have_text("the image cannot be read")
    expect(page.get_by_test_id("send")).to_be_disabled()
    page.get_by_test_id("composer").press("Enter")
    expect(page.get_by_test_id("composer")).to_have_value("please look at this")  # kept, not sent
    expect(user_messages(page)).to_have_count(0)
    chip.get_by_test_id("remove-attachment").click()
    expect(chips(page)).to_have_count(0)
    expect(page.get_by_test_id("send")).to_be_enabled()


def test_a_message_with_an_attachment_in_the_outbox_survives_a_reload(
    own_server: GatewayServer, open_page: Any
) -> None:
    page = open_page(own_server, "user1")
    page.get_by_test_id("attach-input").set_input_files([{"name": "chart.png", "mimeType": "image/png", "buffer": PNG}])
    expect(chips(page).first).to_have_attribute("data-state", "done")
    own_server.stop()
    expect(page.get_by_test_id("connection-status")).to_have_attribute("data-state", re.compile("offline|connecting"))
    page.get_by_test_id("composer").fill("sent from the train")
    page.get_by_test_id("composer").press("Enter")
    expect(user_messages(page).last).to_have_attribute("data-state", "sending")
    stored = json.loads(page.evaluate("localStorage.getItem('agentgate:user1:outbox')"))
    assert stored[0]["text"] == "sent from the train"
    assert [a["fileName"] for a in stored[0]["attachments"]] == ["chart.png"]
    assert stored[0]["attachments"][0]["fileId"].startswith("file-")
    page.close()

    own_server.start()
    again = open_page(own_server, "user1")
    expect(replies(again).last).to_have_text("echo: sent from the train (+1 attachment)", timeout=15_000)
    again.wait_for_function("localStorage.getItem('agentgate:user1:outbox') === null")
