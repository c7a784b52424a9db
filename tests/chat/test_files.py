"""Files: `POST /api/files` and `GET /api/files/<id>` through the real views, and `chat.send` naming an
uploaded file (`{fileId}`) or carrying an image inline, over a real WebSocket (docs/files.md)."""

from __future__ import annotations

import base64
import hashlib

import pytest
from channels.db import database_sync_to_async
from django.core.files.storage import storages
from django.test import AsyncClient

from chat.files.content import NO_TEXT_LAYER
from sessions_app.lifecycle.usage import forget_budget_check
from sessions_app.models import Budget, BudgetScope, Run, RunFile, StoredFile
from tests.support import files as made
from tests.support.communicator import open_client
from tests.support.db import send_params

pytestmark = pytest.mark.django_db(transaction=True)


@database_sync_to_async
def stored(file_id: str) -> StoredFile | None:
    return StoredFile.objects.filter(file_id=file_id).first()


@database_sync_to_async
def has_bytes(name: str) -> bool:
    return storages["attachments"].exists(name)


# --- upload and read ----------------------------------------------------------------------------


async def test_an_image_uploads_and_reads_back_to_its_owner(alice):
    data = made.png()
    answer = await made.upload(alice[1], data, "red.png")
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert set(body) == {"id", "mimeType", "fileName", "size", "sha256"}
    assert body["mimeType"] == "image/png" and body["fileName"] == "red.png"
    assert body["size"] == len(data) and body["sha256"] == hashlib.sha256(data).hexdigest()
    row = await stored(body["id"])
    assert row is not None and row.owner_id == alice[0].pk and await has_bytes(row.storage_name)

    got = await AsyncClient().get(f"/api/files/{body['id']}", headers={"Authorization": f"Bearer {alice[1]}"})
    assert got.status_code == 200 and got.content == data
    assert got["Content-Type"] == "image/png" and got["X-Content-Type-Options"] == "nosniff"
    assert "attachment" not in got.get("Content-Disposition", "")  # an image may show inline

    again = await made.upload(alice[1], data, "same.png")  # the same bytes again: the same file
    assert again.json()["id"] == body["id"]


async def test_a_lying_extension_is_stored_as_what_the_bytes_are_and_served_as_a_download(alice):
    html = b"<html><script>alert(document.cookie)</script></html>"
    answer = await made.upload(alice[1], html, "photo.png")
    assert answer.status_code == 201
    assert answer.json()["mimeType"] == "text/plain"  # not image/png, and never text/html
    got = await AsyncClient().get(f"/api/files/{answer.json()['id']}", headers={"Authorization": f"Bearer {alice[1]}"})
    assert got["Content-Type"] == "text/plain; charset=utf-8"
    assert got["Content-Disposition"].startswith("attachment;") and "photo.png" in got["Content-Disposition"]
    assert got["X-Content-Type-Options"] == "nosniff"

    elf = b"\x7fELF\x02\x01\x01\x00" + bytes(range(256))
    refused = await made.upload(alice[1], elf, "report.pdf")
    assert refused.status_code == 415 and refused.json()["error"]["code"] == "unsupported-type"
    fake_png = b"\x89PNG\r\n\x1a\n" + b"not really a png" * 4
    bad = await made.upload(alice[1], fake_png, "x.png")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad-image"


async def test_uploads_at_and_over_each_limit(alice, settings):
    settings.GATEWAY_MAX_ATTACHMENT_BYTES = 4000
    settings.GATEWAY_MAX_IMAGE_BYTES = 3000
    text_at = b"a" * 4000
    assert (await made.upload(alice[1], text_at, "a.txt")).status_code == 201
    over = await made.upload(alice[1], text_at + b"a", "a.txt")
    assert over.status_code == 413 and over.json()["error"]["code"] == "too-large"

    image = made.png(8, 8)
    image_at = image + b"\x00" * (3000 - len(image))  # trailing bytes after IEND: still a PNG
    answer = await made.upload(alice[1], image_at, "at.png")
    assert answer.status_code == 201 and answer.json()["size"] == 3000
    image_over = await made.upload(alice[1], image_at + b"\x00", "over.png")
    assert image_over.status_code == 413 and "an image is at most 3000 bytes" in image_over.json()["error"]["message"]

    way_over = await made.upload(alice[1], b"a" * 200_000, "big.txt")  # refused from its Content-Length
    assert way_over.status_code == 413
    empty = await made.upload(alice[1], b"", "empty.txt")
    assert empty.status_code == 400


async def test_a_png_bomb_is_refused_before_it_is_decoded(alice, settings):
    claims = await made.upload(alice[1], made.png_claiming(100_000, 100_000), "bomb.png")
    assert claims.status_code == 413 and claims.json()["error"]["code"] == "image-too-large"
    bomb = made.png_bomb(7000)  # 49 million pixels in a few kilobytes
    assert len(bomb) < 100_000
    real = await made.upload(alice[1], bomb, "bomb.png")
    assert real.status_code == 413 and "7000x7000" in real.json()["error"]["message"]
    settings.GATEWAY_MAX_IMAGE_PIXELS = 60 * 60
    assert (await made.upload(alice[1], made.png(60, 60), "ok.png")).status_code == 201
    assert (await made.upload(alice[1], made.png(61, 60), "no.png")).status_code == 413


async def test_pdfs_keep_their_text_and_one_without_a_text_layer_says_so(alice):
    with_text = await made.upload(alice[1], made.pdf("The tide is at noon", "Second page here"), "tide.pdf")
    assert with_text.status_code == 201 and with_text.json()["mimeType"] == "application/pdf"
    row = await stored(with_text.json()["id"])
    assert row is not None and "The tide is at noon" in (row.text or "") and "Second page here" in (row.text or "")
    scanned = await made.upload(alice[1], made.pdf("", ""), "scan.pdf")
    assert scanned.status_code == 201
    assert (await stored(scanned.json()["id"])).text == NO_TEXT_LAYER  # type: ignore[union-attr]
    broken = await made.upload(alice[1], b"%PDF-1.4\n garbage", "broken.pdf")
    assert broken.status_code == 400 and broken.json()["error"]["code"] == "unreadable-pdf"
    csv = await made.upload(alice[1], b"a,b\n1,2\n", "t.csv")
    md = await made.upload(alice[1], b"# Title\n", "t.md")
    js = await made.upload(alice[1], b'{"a": 1}', "t.json")
    not_json = await made.upload(alice[1], b"{not json", "t.json")
    assert [r.json()["mimeType"] for r in (csv, md, js, not_json)] == [
        "text/csv",
        "text/markdown",
        "application/json",
        "text/plain",
    ]


async def test_only_the_owner_and_staff_read_a_file(make_user, alice):
    bob = await database_sync_to_async(make_user)("bob")
    staff = await database_sync_to_async(make_user)("root", staff=True)
    file_id = (await made.upload(alice[1], b"alice's notes", "notes.txt")).json()["id"]
    url = f"/api/files/{file_id}"
    assert (await AsyncClient().get(url, headers={"Authorization": f"Bearer {bob[1]}"})).status_code == 404
    assert (await AsyncClient().get(url)).status_code == 401
    assert (await AsyncClient().get(url, headers={"Authorization": "Bearer nope"})).status_code == 401
    by_staff = await AsyncClient().get(url, headers={"Authorization": f"Bearer {staff[1]}"})
    assert by_staff.status_code == 200 and by_staff.content == b"alice's notes"
    assert (
        await AsyncClient().get("/api/files/file-" + "0" * 32, headers={"Authorization": f"Bearer {alice[1]}"})
    ).status_code == 404


async def test_the_page_uploads_with_its_cookie_and_csrf_token(alice):
    page = AsyncClient(enforce_csrf_checks=True)
    await page.aforce_login(alice[0])
    no_token = await made.upload(None, b"hello", "a.txt", client=page)
    assert no_token.status_code == 403 and no_token.json()["error"]["code"] == "csrf_failed"
    await page.get("/")  # the page sets its CSRF cookie
    token = page.cookies["csrftoken"].value
    answer = await made.upload(None, b"hello", "a.txt", client=page, **{"X-CSRFToken": token})
    assert answer.status_code == 201
    got = await page.get(f"/api/files/{answer.json()['id']}")
    assert got.status_code == 200 and got.content == b"hello"


async def test_a_read_only_key_cannot_upload(alice):
    from sessions_app.tokens import issue_token

    _token, raw = await database_sync_to_async(issue_token)(alice[0], scopes=["read"])
    answer = await made.upload(raw, b"x", "a.txt")
    assert answer.status_code == 403 and answer.json()["error"]["code"] == "insufficient_scope"


async def test_the_storage_backend_is_the_settings_choice(alice, settings):
    settings.STORAGES = {
        **settings.STORAGES,
        "attachments": {"BACKEND": "django.core.files.storage.InMemoryStorage"},
    }
    answer = await made.upload(alice[1], b"kept in memory", "m.txt")
    assert answer.status_code == 201
    row = await stored(answer.json()["id"])
    store = storages["attachments"]
    assert type(store).__name__ == "InMemoryStorage" and store.open(row.storage_name).read() == b"kept in memory"
    got = await AsyncClient().get(f"/api/files/{row.file_id}", headers={"Authorization": f"Bearer {alice[1]}"})
    assert got.content == b"kept in memory"


# --- chat.send naming files ---------------------------------------------------------------------


@database_sync_to_async
def run_of(run_id: str) -> tuple[Run, list[str]]:
    run = Run.objects.get(run_id=run_id)
    return run, [use.file.file_id for use in RunFile.objects.filter(run=run).order_by("position")]


async def test_chat_send_names_an_uploaded_file_and_another_users_is_refused(make_user, alice, client):
    bob = await database_sync_to_async(make_user)("bob")
    mine = (await made.upload(alice[1], made.pdf("Quarterly numbers"), "q.pdf")).json()
    theirs = (await made.upload(bob[1], b"bob's secret", "secret.txt")).json()

    res = await client.call(
        "chat.send", send_params("agent:main:main", "read this", "r-theirs", attachments=[{"fileId": theirs["id"]}])
    )
    assert not res["ok"] and res["error"]["code"] == "INVALID_REQUEST"
    assert res["error"]["details"]["field"] == "attachments[0].fileId"
    assert "not found among your files" in res["error"]["message"]
    assert not await database_sync_to_async(Run.objects.filter(run_id="r-theirs").exists)()

    bad = await client.call(
        "chat.send", send_params("agent:main:main", "x", "r-bad", attachments=[{"fileId": "../etc/passwd"}])
    )
    assert not bad["ok"] and bad["error"]["details"]["field"] == "attachments[0].fileId"

    ack = await client.ok(
        "chat.send", send_params("agent:main:main", "read this", "r-mine", attachments=[{"fileId": mine["id"]}])
    )
    assert ack["status"] == "started"
    await client.wait_terminal("r-mine")
    run, used = await run_of("r-mine")
    assert used == [mine["id"]]
    [kept] = run.attachments
    assert (
        kept["fileId"] == mine["id"] and kept["mimeType"] == "application/pdf" and "Quarterly numbers" in kept["text"]
    )


async def test_history_lists_the_files_a_prompt_was_sent_with(alice, client):
    doc = (await made.upload(alice[1], made.pdf("Quarterly numbers"), "q.pdf")).json()
    image = (await made.upload(alice[1], made.png(4, 4), "dot.png")).json()
    files = [{"fileId": doc["id"]}, {"fileId": image["id"]}]
    await client.ok("chat.send", send_params("agent:main:main", "[[tick:0]] read", "r-files", attachments=files))
    await client.wait_terminal("r-files")
    await client.ok("chat.send", send_params("agent:main:main", "[[tick:0]] and no file", "r-plain"))
    await client.wait_terminal("r-plain")

    history = await client.ok("chat.history", {"sessionKey": "agent:main:main"})
    prompts = {m["runId"]: m for m in history["messages"] if m["role"] == "user"}
    assert prompts["r-files"]["attachments"] == [
        {"fileId": doc["id"], "mimeType": "application/pdf", "fileName": "q.pdf", "size": doc["size"]},
        {"fileId": image["id"], "mimeType": "image/png", "fileName": "dot.png", "size": image["size"]},
    ]  # named, never their text or bytes
    assert "attachments" not in prompts["r-plain"]
    assert all("attachments" not in m for m in history["messages"] if m["role"] != "user")


async def test_an_inline_image_is_stored_too(alice, client):
    data = made.png(10, 10)
    ack = await client.ok(
        "chat.send",
        send_params(
            "agent:main:main",
            "look",
            "r-inline",
            attachments=[{"mimeType": "image/png", "fileName": "dot.png", "content": base64.b64encode(data).decode()}],
        ),
    )
    assert ack["status"] == "started"
    await client.wait_terminal("r-inline")
    run, used = await run_of("r-inline")
    assert len(used) == 1 and run.attachments[0]["fileId"] == used[0] and "_bytes" not in run.attachments[0]
    row = await stored(used[0])
    assert row is not None and row.owner_id == alice[0].pk and row.sha256 == hashlib.sha256(data).hexdigest()
    assert storages["attachments"].open(row.storage_name).read() == data


async def test_a_refused_send_keeps_none_of_its_inline_files(alice, client, settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "attachments": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path)},
        },
    }
    await database_sync_to_async(Budget.objects.create)(scope=BudgetScope.USER, user=alice[0], max_tokens=1)
    forget_budget_check()
    inline = [{"mimeType": "image/png", "fileName": "dot.png", "content": base64.b64encode(made.png(12, 12)).decode()}]
    res = await client.call("chat.send", send_params("agent:main:main", "look", "r-refused", attachments=inline))
    assert not res["ok"] and res["payload"]["errorKind"] == "budget"
    assert not await database_sync_to_async(StoredFile.objects.exists)()  # no row
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []  # and no bytes


async def test_hello_ok_announces_the_attachment_limits(alice, settings):
    settings.GATEWAY_MAX_IMAGE_BYTES = 1234
    c = await open_client(alice[1], subscribe=False)
    policy = c.hello["policy"]
    await c.close()
    # OpenClaw's shape (its schema closes this object), the rest beside it
    assert policy["attachments"] == {"maxBytes": settings.GATEWAY_MAX_ATTACHMENT_BYTES, "maxImageBytes": 1234}
    assert "application/pdf" in policy["attachmentTypes"] and policy["uploadUrl"] == "/api/files"
