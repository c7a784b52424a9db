"""Usage and budgets in the admin: budgets with their state (operators set limits; the counters are the
lifecycle's), usage rows newest first, and usage summed by user, agent, model or day over a range of
days, with a CSV export.

Fast at a million rows: the row list counts by estimate and reads one page in index order
(`usage_created_id`); a summary reads the range's rows through the (day, agent, model) and
(user, day) indexes and groups them in the database, never counting the table.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib import admin
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils import timezone

from sessions_app import usage_reads
from sessions_app.admin.common import EstimatedCountPaginator
from sessions_app.lifecycle.usage import period_end, period_start
from sessions_app.models import Budget, UsageRecord

# The fields an operator sets; the counters are written only by `lifecycle.usage`, and a save of the
# form never writes them (a reservation taken meanwhile would be overwritten).
BUDGET_SETTINGS = ("name", "scope", "user", "group", "agent_id", "api_token", "period", "max_tokens",
                   "max_cost_micros", "enabled")  # fmt: skip
SUMMARY_DAYS = 7


@admin.register(Budget)
class BudgetAdmin(admin.ModelAdmin):
    list_display = ("__str__", "scope", "period", "max_tokens", "used_tokens", "reserved_tokens", "cost_state",
                    "used_percent", "resets_at", "enabled")  # fmt: skip
    list_filter = ("scope", "period", "enabled")
    autocomplete_fields = ("user", "api_token")
    readonly_fields = ("period_start", "used_tokens", "used_cost_micros", "reserved_tokens", "reserved_cost_micros")
    ordering = ("id",)

    def save_model(self, request: HttpRequest, obj: Budget, form: Any, change: bool) -> None:
        if change:
            obj.save(update_fields=BUDGET_SETTINGS)
        else:
            obj.save()

    @admin.display(description="cost (USD) used / max")
    def cost_state(self, obj: Budget) -> str:
        limit = "-" if obj.max_cost_micros is None else f"{obj.max_cost_micros / 1e6:.4f}"
        return f"{obj.used_cost_micros / 1e6:.4f} / {limit}"

    @admin.display(description="used %")
    def used_percent(self, obj: Budget) -> str:
        state = usage_reads.BudgetState(obj, obj.used_tokens, obj.used_cost_micros, None)
        start = period_start(obj.period, timezone.now())
        if start is not None and (obj.period_start is None or obj.period_start < start):
            return "0 (new period)"
        return f"{state.used_fraction * 100:.0f}"

    @admin.display(description="resets at")
    def resets_at(self, obj: Budget) -> str:
        end = period_end(obj.period, timezone.now())
        return end.isoformat() if end else "never"


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    list_display = ("created_at", "user", "agent_id", "model", "run_id", "step", "input_tokens", "output_tokens",
                    "cached_tokens", "reasoning_tokens", "cost", "estimated", "unknown")  # fmt: skip
    list_select_related = ("user",)
    ordering = ("-created_at", "-id")
    sortable_by = ()
    list_per_page = 100
    show_full_result_count = False
    change_list_template = "admin/sessions_app/usagerecord/change_list.html"

    def get_paginator(
        self, request: HttpRequest, queryset: Any, per_page: int, orphans: int = 0, allow_empty_first_page: bool = True
    ) -> Paginator:
        return EstimatedCountPaginator(
            queryset, per_page, orphans=orphans, allow_empty_first_page=allow_empty_first_page
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="cost (USD)")
    def cost(self, obj: UsageRecord) -> str:
        return "-" if obj.cost_micros is None else f"{obj.cost_micros / 1e6:.6f}"

    def get_urls(self) -> list[URLPattern]:
        summary = path("summary/", self.admin_site.admin_view(self.summary_view), name="sessions_app_usage_summary")
        return [summary, *super().get_urls()]

    def summary_view(self, request: HttpRequest) -> HttpResponse:
        """Usage summed by user, agent, model or day from `start` to `end` (`?format=csv` to export)."""
        today = timezone.now().date()
        end = _day(request.GET.get("end"), today)
        start = _day(request.GET.get("start"), end - dt.timedelta(days=SUMMARY_DAYS - 1))
        group = request.GET.get("group", "day")
        by = usage_reads.GROUPINGS.get(group, usage_reads.GROUPINGS["day"])
        rows = usage_reads.summary_rows(start, end, by)
        if request.GET.get("format") == "csv":
            return csv_response(rows, by, f"usage-{group}-{start}-{end}.csv")
        context = {
            **self.admin_site.each_context(request),
            "title": "Usage summary",
            "rows": rows,
            "columns": by,
            "start": start,
            "end": end,
            "group": group,
            "groups": list(usage_reads.GROUPINGS),
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/sessions_app/usagerecord/summary.html", context)


def _day(value: str | None, default: dt.date) -> dt.date:
    try:
        return dt.date.fromisoformat(value) if value else default
    except ValueError:
        return default


def csv_response(rows: list[dict[str, Any]], by: tuple[str, ...], filename: str) -> HttpResponse:
    response = HttpResponse(content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    usage_reads.write_summary_csv(response, rows, by)
    return response
