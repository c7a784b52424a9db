"""Stored files (read-only: they come and go with the runs that use them) and a run's attachments."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from sessions_app.models import StoredFile


def attachment_list(items: list[dict[str, Any]]) -> str:
    """A run's attachments as the admin shows them: name, type, size, and the stored file's link."""
    if not items:
        return "-"
    return format_html(
        "<ul>{}</ul>",
        format_html_join(
            "",
            "<li>{} ({}, {} bytes){}</li>",
            (
                (
                    a.get("fileName") or "-",
                    a.get("mimeType") or "?",
                    a.get("size") if a.get("size") is not None else "?",
                    format_html(' <a href="{}">{}</a>', reverse("files_read", args=[a["fileId"]]), a["fileId"])
                    if a.get("fileId")
                    else "",
                )
                for a in items
                if isinstance(a, dict)
            ),
        ),
    )


@admin.register(StoredFile)
class StoredFileAdmin(admin.ModelAdmin):
    list_display = ("file_id", "owner", "mime_type", "size", "name", "runs", "created_at")
    list_filter = ("mime_type",)
    search_fields = ("file_id", "name", "sha256", "owner__username")
    readonly_fields = ("file_id", "owner", "sha256", "mime_type", "name", "size", "storage_name", "created_at")
    exclude = ("text",)
    list_select_related = ("owner",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[StoredFile]:
        return super().get_queryset(request).annotate(run_count=Count("uses"))

    @admin.display(description="runs using it", ordering="run_count")
    def runs(self, obj: StoredFile) -> int:
        return int(getattr(obj, "run_count", 0))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: StoredFile | None = None) -> bool:
        return False
