"""Stored files do not linger: a deleted session (by its owner or by retention) takes its files' bytes
with it, the orphan sweep removes what nothing uses, the admin shows a run's attachments and /metrics
counts the stored bytes."""

from __future__ import annotations

import io
import os
from datetime import timedelta
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.core.files.base import ContentFile
from django.core.files.storage import storages
from django.core.management import call_command
from django.test import Client as DjangoClient
from django.urls import reverse
from django.utils import timezone

from sessions_app.models import Run, StoredFile
from sessions_app.operations.prune import prune_sessions
from tests.chat.test_ops import samples
from tests.support import files as made
from tests.support.db import send_params

pytestmark = pytest.mark.django_db(transaction=True)


def _state(file_id: str) -> tuple[bool, bool]:
    """(the row exists, its bytes exist)."""
    row = StoredFile.objects.filter(file_id=file_id).first()
    if row is None:
        return False, any(file_id in name for name in _all_names())
    return True, storages["attachments"].exists(row.storage_name)


def _all_names() -> list[str]:
    store = storages["attachments"]
    out: list[str] = []

    def walk(folder: str) -> None:
        try:
            dirs, names = store.listdir(folder)
        except FileNotFoundError:
            return
        out.extend(f"{folder}/{n}" for n in names)
        for d in dirs:
            walk(f"{folder}/{d}")

    walk("files")
    return out


state = database_sync_to_async(_state)


async def _send(client: Any, key: str, run_id: str, file_id: str) -> None:
    ack = await client.ok("chat.send", send_params(key, "see file", run_id, attachments=[{"fileId": file_id}]))
    assert ack["status"] in ("started", "queued")
    await client.wait_terminal(run_id)


async def test_deleting_a_session_removes_its_files_bytes_once_no_run_uses_them(alice, client):
    shared = (await made.upload(alice[1], b"used by two sessions", "shared.txt")).json()["id"]
    own = (await made.upload(alice[1], made.png(), "own.png")).json()["id"]
    await _send(client, "agent:main:one", "a1", shared)
    await _send(client, "agent:main:one", "a2", own)
    await _send(client, "agent:main:two", "b1", shared)
    assert await state(own) == (True, True) and await state(shared) == (True, True)

    assert (await client.ok("sessions.delete", {"key": "agent:main:one"}))["deleted"] is True
    assert await state(own) == (False, False)  # no run uses it any more: row and bytes gone
    assert await state(shared) == (True, True)  # session two's run still uses it
    await client.ok("sessions.delete", {"key": "agent:main:two"})
    assert await state(shared) == (False, False)


async def test_retention_removes_the_bytes_of_the_sessions_it_prunes(alice, client):
    file_id = (await made.upload(alice[1], made.pdf("old news"), "old.pdf")).json()["id"]
    await _send(client, "agent:main:old", "o1", file_id)
    result = await database_sync_to_async(prune_sessions)(
        older_than_days=0, broadcast=False, now=timezone.now() + timedelta(seconds=5)
    )
    assert result.sessions == 1 and result.runs == 1
    assert await state(file_id) == (False, False)
    assert not await database_sync_to_async(Run.objects.filter(run_id="o1").exists)()


def _age(file_id: str, hours: float) -> None:
    StoredFile.objects.filter(file_id=file_id).update(created_at=timezone.now() - timedelta(hours=hours))


async def test_the_orphan_sweep_removes_unused_old_uploads_and_stray_bytes(alice, client, settings, tmp_path):
    # a storage of this test's own: other tests' bytes (their rows gone with their database) are not here
    settings.STORAGES = {
        **settings.STORAGES,
        "attachments": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "stored")},
        },
    }
    old = (await made.upload(alice[1], b"never sent", "old.txt")).json()["id"]
    fresh = (await made.upload(alice[1], b"just uploaded", "fresh.txt")).json()["id"]
    used = (await made.upload(alice[1], b"sent long ago", "used.txt")).json()["id"]
    await _send(client, "agent:main:keep", "u1", used)
    for file_id in (old, used):
        await database_sync_to_async(_age)(file_id, 48)
    stray = await database_sync_to_async(storages["attachments"].save)("files/zz/stray-object", ContentFile(b"x"))
    long_ago = (timezone.now() - timedelta(hours=48)).timestamp()
    os.utime(storages["attachments"].path(stray), (long_ago, long_ago))
    # bytes saved just now without a row yet: an upload in flight (its row comes after its bytes)
    in_flight = await database_sync_to_async(storages["attachments"].save)("files/zz/in-flight", ContentFile(b"y"))

    def sweep(*args: str) -> str:
        out = io.StringIO()
        call_command("clean_files", *args, stdout=out)
        return out.getvalue()

    dry = await database_sync_to_async(sweep)("--dry-run")
    assert "Would remove 1 unused file(s) and 1 stray stored object(s)." in dry and old in dry and stray in dry
    # its progress (3 files, 2 without a row)
    assert "checking 1 unused files" in dry and "checking 5 stored bytes" in dry and in_flight not in dry
    assert await state(old) == (True, True)

    done = await database_sync_to_async(sweep)()
    assert "Removed 1 unused file(s) and 1 stray stored object(s)." in done
    assert await state(old) == (False, False)
    assert await state(fresh) == (True, True) and await state(used) == (True, True)
    assert not await database_sync_to_async(storages["attachments"].exists)(stray)
    assert await database_sync_to_async(storages["attachments"].exists)(in_flight)


async def test_an_old_upload_uploaded_again_is_young_again(alice, settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "attachments": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path)},
        },
    }
    first = (await made.upload(alice[1], b"the same bytes", "a.txt")).json()["id"]
    await database_sync_to_async(_age)(first, 48)
    again = (await made.upload(alice[1], b"the same bytes", "a.txt")).json()["id"]
    assert again == first  # one file per owner and content
    out = io.StringIO()
    await database_sync_to_async(call_command)("clean_files", stdout=out)
    assert await state(first) == (True, True), out.getvalue()  # about to be sent: not an orphan


async def test_the_admin_shows_a_runs_attachments_and_metrics_count_stored_bytes(make_user, alice, client):
    pdf = made.pdf("admin view")
    file_id = (await made.upload(alice[1], pdf, "report.pdf")).json()["id"]
    text_id = (await made.upload(alice[1], b"12345", "five.txt")).json()["id"]
    await _send(client, "agent:main:admin", "ad1", file_id)
    staff = await database_sync_to_async(make_user)("root", staff=True)

    def pages() -> tuple[str, str]:
        admin = DjangoClient()
        staff[0].is_superuser = True
        staff[0].save()
        admin.force_login(staff[0])
        run = Run.objects.get(run_id="ad1")
        run_page = admin.get(reverse("admin:sessions_app_run_change", args=[run.pk])).content.decode()
        files_page = admin.get(reverse("admin:sessions_app_storedfile_changelist")).content.decode()
        return run_page, files_page

    run_page, files_page = await database_sync_to_async(pages)()
    assert "report.pdf (application/pdf," in run_page and f'href="/api/files/{file_id}"' in run_page
    assert file_id in files_page and text_id in files_page

    metrics = await database_sync_to_async(lambda: DjangoClient().get("/metrics").content.decode())()
    found = samples(metrics)
    assert found[("agentgate_stored_files", ())] == 2
    assert found[("agentgate_stored_file_bytes", ())] == len(pdf) + 5
