"""The chat sessions' list filters: stuck, failed recently, status (with "never ran"), waiting for an approval.

Each has fixed choices (a field filter would read the distinct values of every row) and filters
through `operator_reads`, which holds the one definition of each.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from sessions_app import operator_reads
from sessions_app.admin.common import live_ids
from sessions_app.models import SessionStatus


class StuckFilter(admin.SimpleListFilter):
    """Running or queued with nothing behind it, or running longer than the threshold."""

    title = "stuck"
    parameter_name = "stuck"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        minutes = settings.GATEWAY_STUCK_RUN_SECONDS // 60
        return [("yes", f"Stuck (no live process, or running > {minutes} min)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "yes":
            return queryset.filter(pk__in=operator_reads.stuck_session_ids_query(live_ids(request)))
        return queryset


class FailedRecentlyFilter(admin.SimpleListFilter):
    """Sessions whose last run failed within a window (`operator_reads.failed_sessions`)."""

    title = "failed recently"
    parameter_name = "failed"
    # "24h" is the window of the changelist's "failed (24 h)" count, which links here
    WINDOWS = {"24h": operator_reads.FAILED_WINDOW, "7d": timedelta(days=7)}

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("24h", "Failed in the last 24 h"), ("7d", "Failed in the last 7 days")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        window = self.WINDOWS.get(self.value() or "")
        if window is None:
            return queryset
        return operator_reads.failed_sessions(timezone.now() - window, among=queryset)


class StatusFilter(admin.SimpleListFilter):
    """Status with 'never ran' (no query for the choices, unlike a field filter)."""

    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [*SessionStatus.choices, ("none", "Never ran")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value == "none":
            return queryset.filter(status__isnull=True)
        if value in SessionStatus.values:
            return queryset.filter(status=value)
        return queryset


class WaitingForFilter(admin.SimpleListFilter):
    """Sessions whose active run waits for an approval (`waitingFor: "approval"`, TOOLS.md §13.2)."""

    title = "waiting for"
    parameter_name = "waiting"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("approval", "An approval")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "approval":
            return operator_reads.sessions_waiting_on_approval(among=queryset)
        return queryset
