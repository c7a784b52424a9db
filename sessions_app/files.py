"""Stored files: their rows and their bytes (the `attachments` storage), one module for both.

A file is stored once per owner and content (the same bytes uploaded twice are one file). A run
uses a file through a `RunFile` row, written when the run is admitted; when the last run using a
file goes (its session deleted, by a user or by retention), the file's row and bytes go with it,
after the deleting transaction commits. An upload no run uses is an orphan once it is older than
`GATEWAY_FILE_ORPHAN_HOURS` (`orphans`, `manage.py clean_files`).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import Storage, storages
from django.db import transaction
from django.db.models import Sum
from django.db.models.signals import post_delete
from django.dispatch import receiver
from django.utils import timezone

from sessions_app.models import Run, RunFile, StoredFile

log = logging.getLogger(__name__)
STORAGE_ALIAS = "attachments"
FOLDER = "files"


def storage() -> Storage:
    """The storage the bytes live in (settings.STORAGES["attachments"])."""
    return storages[STORAGE_ALIAS]


def new_file_id() -> str:
    return "file-" + secrets.token_hex(16)


# a file stored for a request, as it was stored (`store`'s `stored_now`; `forget_unsent`)
StoredNow = tuple[int, datetime]


def store(
    *,
    owner_id: int,
    data: bytes,
    mime_type: str,
    name: str,
    sha256: str,
    text: str | None,
    stored_now: list[StoredNow] | None = None,
) -> StoredFile:
    """Keep `data` (already inspected) for `owner_id`: the owner's file with the same bytes and type
    when there is one, else new bytes in storage and a new row (added to `stored_now`)."""
    found = StoredFile.objects.filter(owner_id=owner_id, sha256=sha256, mime_type=mime_type).first()
    if found is not None and storage().exists(found.storage_name):
        # uploaded again: as young as this upload, or the orphan sweep could take it before it is sent
        found.created_at = timezone.now()
        StoredFile.objects.filter(pk=found.pk).update(created_at=found.created_at)
        return found
    file_id = new_file_id()
    stored_name = storage().save(f"{FOLDER}/{file_id[5:7]}/{file_id}", ContentFile(data))
    try:
        made = StoredFile.objects.create(
            file_id=file_id,
            owner_id=owner_id,
            sha256=sha256,
            mime_type=mime_type,
            name=name[:255],
            size=len(data),
            storage_name=stored_name,
            text=text,
        )
    except Exception:
        storage().delete(stored_name)  # no row, no bytes
        raise
    if stored_now is not None:
        stored_now.append((made.pk, made.created_at))
    return made


def forget_unsent(stored_now: Iterable[StoredNow]) -> int:
    """The files a request stored inline, gone again (rows and bytes) unless a run uses them: a
    refused send leaves nothing behind. A file uploaded again since (its `created_at` moved) stays."""
    return _delete(
        [f for pk, at in stored_now for f in StoredFile.objects.filter(pk=pk, created_at=at, uses__isnull=True)]
    )


def find(file_id: str) -> StoredFile | None:
    if not isinstance(file_id, str) or len(file_id) > 40:
        return None
    return StoredFile.objects.filter(file_id=file_id).first()


def owned(owner_id: int, file_ids: Iterable[str]) -> dict[str, StoredFile]:
    """Those of `file_ids` that are `owner_id`'s files, by id (another's are simply not found)."""
    ids = [f for f in file_ids if isinstance(f, str) and len(f) <= 40]
    return {f.file_id: f for f in StoredFile.objects.filter(owner_id=owner_id, file_id__in=ids)}


def read_bytes(stored: StoredFile) -> bytes:
    with storage().open(stored.storage_name, "rb") as handle:
        data: bytes = handle.read()
        return data


def bytes_of(file_ids: Iterable[str]) -> dict[str, bytes]:
    """The bytes of these files, by id (a file gone meanwhile is left out)."""
    out: dict[str, bytes] = {}
    for stored in StoredFile.objects.filter(file_id__in=list(file_ids)):
        try:
            out[stored.file_id] = read_bytes(stored)
        except OSError as exc:
            log.warning("stored file %s cannot be read: %s", stored.file_id, exc)
    return out


def files_of_run(run_pk: int) -> list[StoredFile]:
    return [use.file for use in RunFile.objects.select_related("file").filter(run_id=run_pk).order_by("position")]


def attachments_of(run_pks: Iterable[int]) -> dict[int, list[dict[str, Any]]]:
    """The attachments of those of these runs that have any, by run pk (a transcript's earlier turns)."""
    rows = Run.objects.filter(pk__in=list(run_pks)).exclude(attachments=[]).values_list("pk", "attachments")
    return {pk: list(items) for pk, items in rows if items}


def listed(run_pks: Iterable[int]) -> dict[int, list[dict[str, Any]]]:
    """The files these runs were sent with, by run pk, as a transcript lists them (id, type, name,
    size; never their text or bytes): one query."""
    found: dict[int, list[dict[str, Any]]] = {}
    rows = (
        RunFile.objects.filter(run_id__in=list(run_pks))
        .order_by("run_id", "position")
        .values_list("run_id", "file__file_id", "file__mime_type", "file__name", "file__size")
    )
    for run_pk, file_id, mime_type, name, size in rows:
        found.setdefault(run_pk, []).append(
            {"fileId": file_id, "mimeType": mime_type, "fileName": name or None, "size": size}
        )
    return found


def stored_totals() -> tuple[int, int]:
    """How many files are stored and their bytes (what /metrics reports)."""
    found = StoredFile.objects.aggregate(total=Sum("size"))
    return StoredFile.objects.count(), int(found["total"] or 0)


# --- uses and their end ---------------------------------------------------------------------


def link_run(run: Run) -> None:
    """A new run's attachments that name stored files become its uses (in its admitting transaction)."""
    names = {i: a["fileId"] for i, a in enumerate(run.attachments or []) if isinstance(a, dict) and a.get("fileId")}
    if not names:
        return
    rows = {f.file_id: f.pk for f in StoredFile.objects.filter(file_id__in=list(names.values()))}
    RunFile.objects.bulk_create(
        [RunFile(run=run, file_id=rows[fid], position=i) for i, fid in names.items() if fid in rows]
    )


@receiver(post_delete, sender=RunFile, dispatch_uid="files-release-on-delete")
def _use_deleted(sender: Any, instance: RunFile, **kwargs: Any) -> None:
    """A run's use went (its session deleted): once that commits, the file goes too if nothing uses it."""
    file_pk = instance.file_id
    transaction.on_commit(lambda: release([file_pk]))


def release(file_pks: Iterable[int]) -> int:
    """Delete the rows and bytes of these files (each one a run used) that no run uses any more; how
    many went. A file is used by the runs that name it: once the last goes, the file goes."""
    return _delete(list(StoredFile.objects.filter(pk__in=list(file_pks), uses__isnull=True)))


def _delete(files: list[StoredFile]) -> int:
    gone = 0
    for stored in files:
        deleted, _ = StoredFile.objects.filter(pk=stored.pk, uses__isnull=True).delete()
        if deleted:
            _remove_bytes(stored.storage_name)
            gone += 1
    return gone


def _remove_bytes(name: str) -> None:
    try:
        storage().delete(name)
    except OSError as exc:  # left for the orphan sweep
        log.warning("stored bytes %s could not be removed: %s", name, exc)


# --- orphans ------------------------------------------------------------------------------


@dataclass
class OrphanReport:
    """What the orphan sweep found (and, unless a dry run, removed)."""

    dry_run: bool
    unused_rows: list[str] = field(default_factory=list)  # files no run uses, older than the grace
    stray_bytes: list[str] = field(default_factory=list)  # bytes in storage that no row names
    missing_bytes: list[str] = field(default_factory=list)  # rows whose bytes are gone (reported only)

    def as_dict(self) -> dict[str, object]:
        return {
            "dryRun": self.dry_run,
            "unusedFiles": len(self.unused_rows),
            "strayBytes": len(self.stray_bytes),
            "missingBytes": len(self.missing_bytes),
        }


def _walk(store: Storage, folder: str) -> Iterator[str]:
    try:
        dirs, names = store.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return
    for name in names:
        yield f"{folder}/{name}"
    for sub in dirs:
        yield from _walk(store, f"{folder}/{sub}")


def _stray(store: Storage, name: str, cutoff: datetime) -> bool:
    """Bytes no row names, and old: an upload saves its bytes before its row, so young bytes without
    a row may be an upload in flight (kept), and a row made since the names were read counts."""
    try:
        if store.get_modified_time(name) >= cutoff:
            return False
    except (NotImplementedError, OSError):
        pass  # a storage that cannot tell: the row check below still guards an upload that finished
    return not StoredFile.objects.filter(storage_name=name).exists()


def orphans(
    *,
    dry_run: bool = False,
    now: datetime | None = None,
    progress: Callable[[str, int], Callable[[int], None] | None] | None = None,
) -> OrphanReport:
    """Find (and unless `dry_run` remove) unused old files and stray bytes; report rows without bytes.

    `progress(stage, total)` may return a callback advanced as each stage handles its items
    (`unused files`, then `stored bytes`)."""
    report = OrphanReport(dry_run=dry_run)
    cutoff = (now or timezone.now()) - timedelta(hours=settings.GATEWAY_FILE_ORPHAN_HOURS)
    store = storage()
    unused = list(StoredFile.objects.filter(uses__isnull=True, created_at__lt=cutoff))
    step = progress("unused files", len(unused)) if progress is not None else None
    for stored in unused:
        report.unused_rows.append(stored.file_id)
        if not dry_run:
            _delete([stored])
        if step is not None:
            step(1)
    names = list(_walk(store, FOLDER))
    known = set(StoredFile.objects.values_list("storage_name", flat=True))
    step = progress("stored bytes", len(names)) if progress is not None else None
    for name in names:
        if name not in known and _stray(store, name, cutoff):
            report.stray_bytes.append(name)
            if not dry_run:
                _remove_bytes(name)
        if step is not None:
            step(1)
    present = set(names)
    report.missing_bytes = [
        file_id
        for file_id, name in StoredFile.objects.values_list("file_id", "storage_name")
        if name not in present and not store.exists(name)
    ]
    return report
