"""Gateway processes: live or dead, read-only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from sessions_app import operator_reads
from sessions_app.admin.common import ReadOnlyMixin
from sessions_app.models import (
    GatewayProcess,
)


@admin.register(GatewayProcess)
class GatewayProcessAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("server_id", "hostname", "pid", "started_at", "heartbeat_at", "live", "busy", "stopped_at")
    ordering = ("-started_at",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[GatewayProcess]:
        return operator_reads.processes_with_liveness()

    @admin.display(boolean=True, description="alive")
    def live(self, obj: Any) -> bool:
        return bool(obj.is_live)

    @admin.display(boolean=True, description="has active runs")
    def busy(self, obj: Any) -> bool:
        return bool(obj.has_active_runs)
