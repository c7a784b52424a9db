"""A send's attachments made ready for admission: `{fileId}` ones resolved for their owner (another's
file is not found), inline images' bytes stored, so every image a run has is a stored file."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from chat.base.db import db_read, db_write
from chat.methods.send.params import INLINE_BYTES
from chat.protocol.errors import invalid
from sessions_app import files


async def prepare(
    owner_id: int, attachments: list[dict[str, Any]], stored_now: list[files.StoredNow] | None = None
) -> list[dict[str, Any]]:
    """The attachments as a run keeps them (JSON only); raise INVALID_REQUEST for a file not found.
    Files stored now (inline ones not stored before) are added to `stored_now`: the caller forgets
    them if the send is not admitted (`unsent_forgotten`)."""
    if not attachments:
        return attachments
    if any(INLINE_BYTES in a for a in attachments):
        return await db_write(_prepared, owner_id, attachments, stored_now)
    if any("fileId" in a for a in attachments):
        return await db_read(_prepared, owner_id, attachments)
    return attachments


@contextlib.asynccontextmanager
async def unsent_forgotten(stored_now: list[files.StoredNow]) -> AsyncIterator[None]:
    """Around a send's admission (and an HTTP request's checks before it): what `prepare` stored for it
    goes again unless its run was admitted with it, so a refused send leaves nothing behind.

    Not when the handler is cancelled (its client or connection left): the admission may still be
    going on in its database thread (HTTP's `runs.start` shields it), and its uses are not visible
    before it commits. Such files are the orphan sweep's."""
    try:
        yield
    except asyncio.CancelledError:
        raise
    except BaseException:
        await _forget(stored_now)
        raise
    await _forget(stored_now)


async def _forget(stored_now: list[files.StoredNow]) -> None:
    if stored_now:
        await db_write(files.forget_unsent, stored_now)


def _prepared(
    owner_id: int, attachments: list[dict[str, Any]], stored_now: list[files.StoredNow] | None = None
) -> list[dict[str, Any]]:
    named = files.owned(owner_id, [a["fileId"] for a in attachments if "fileId" in a and "sha256" not in a])
    out = []
    for item in attachments:
        if "fileId" in item and "sha256" not in item:
            stored = named.get(item["fileId"])
            if stored is None:
                raise invalid(
                    f"file {item['fileId']} was not found among your files (upload it with POST /api/files)",
                    field=item.get("where", "attachments"),
                    reason="unknown-file",
                )
            out.append(
                {
                    "mimeType": stored.mime_type,
                    "fileName": stored.name or None,
                    "size": stored.size,
                    "sha256": stored.sha256,
                    "text": stored.text,
                    "fileId": stored.file_id,
                }
            )
        elif INLINE_BYTES in item:
            kept = {k: v for k, v in item.items() if k != INLINE_BYTES}
            stored = files.store(
                owner_id=owner_id,
                data=item[INLINE_BYTES],
                mime_type="image/jpeg" if item["mimeType"] == "image/jpg" else item["mimeType"],
                name=item.get("fileName") or "",
                sha256=item["sha256"],
                text=None,
                stored_now=stored_now,
            )
            out.append({**kept, "fileId": stored.file_id})
        else:
            out.append(item)
    return out
