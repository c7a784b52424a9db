"""Runs: filters (waiting on approval among them), the run's tool calls and timeline, and aborting selected runs."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import F, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html

from sessions_app import operator_reads
from sessions_app.admin.common import (
    RUN_HEAVY_FIELDS,
    RowAnnotationsMixin,
    Skipped,
    duration,
    timeline_events,
    timeline_table,
    too_many,
)
from sessions_app.admin.tools import tool_call_table
from sessions_app.lifecycle import LifecycleError
from sessions_app.lifecycle import sessions as session_services
from sessions_app.models import (
    ACTIVE_STATES,
    Actor,
    LifecycleEvent,
    Run,
    RunState,
)


class ErrorKindFilter(admin.SimpleListFilter):
    """Fixed choices: a field filter would read the distinct values of a million rows."""

    title = "error kind"
    parameter_name = "error_kind"
    KINDS = ("dispatch", "backend", "timeout", "interrupted", "rate_limit", "context_length", "unknown")

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(k, k) for k in self.KINDS]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(error_kind=self.value()) if self.value() else queryset


class WaitingOnApprovalFilter(admin.SimpleListFilter):
    """Runs with a pending approval (driven by the few pending approvals, not by the runs)."""

    title = "waiting on"
    parameter_name = "waiting"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("approval", "Approval (pending)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "approval":
            return queryset.filter(pk__in=operator_reads.runs_waiting_on_approval())
        return queryset


@admin.register(Run)
class RunAdmin(RowAnnotationsMixin, admin.ModelAdmin):
    list_display = (
        "run_id",
        "session_link",
        "owner_name",
        "state",
        "owner_process",
        "created_at",
        "dispatched_at",
        "ended_at",
        "duration",
        "error_kind",
        "stop_reason",
        "prompt_tokens",
        "completion_tokens",
        "tool_calls",
    )
    list_filter = ("state", ErrorKindFilter, WaitingOnApprovalFilter)
    search_fields = ("=run_id",)  # enables the search box; the lookup itself is below
    search_help_text = "Exact runId."
    ordering = ("-id",)
    list_per_page = 50
    show_full_result_count = False  # a second COUNT over a million runs buys nothing
    actions = ("abort_selected",)
    readonly_fields = (
        "session_link",
        "run_id",
        "session_generation",
        "state",
        "queue_mode",
        "queue_seq",
        "message",
        "reply",
        "attachments_summary",
        "stream_seq",
        "error_kind",
        "error_message",
        "stop_reason",
        "timeout_ms",
        "owner_process",
        "created_by",
        "prompt_tokens",
        "completion_tokens",
        "cancel_ms",
        "created_at",
        "dispatched_at",
        "started_at",
        "ended_at",
        "duration",
        "tool_calls",
        "tool_call_list",
        "timeline",
    )
    fieldsets = (
        (None, {"fields": readonly_fields[:-3]}),
        ("Tool calls", {"fields": ("tool_calls", "tool_call_list")}),
        ("Lifecycle audit", {"fields": ("timeline",)}),
    )

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A bare row delete would strand its session ("running" with no run, queue stuck)
        # and skip the audit and the broadcast; delete the session, or abort the run.
        return False

    def annotate_rows(self, queryset: QuerySet[Any], request: HttpRequest) -> QuerySet[Any]:
        qs = queryset.annotate(
            session_key=F("session__key"),
            owner_username=F("session__owner__username"),
            session_owner_id=F("session__owner_id"),
        )
        match = request.resolver_match
        if match is not None and (match.url_name or "").endswith("_changelist"):
            qs = qs.defer(*RUN_HEAVY_FIELDS)
        return qs

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Run], search_term: str
    ) -> tuple[QuerySet[Run], bool]:
        # Exact and case-sensitive, so the run_id index serves it (iexact is a LIKE on SQLite).
        term = search_term.strip()
        return (queryset.filter(run_id=term) if term else queryset), False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra = {"show_save": False, "show_save_and_continue": False, **(extra_context or {})}
        return super().change_view(request, object_id, form_url, extra)

    def save_model(self, request: HttpRequest, obj: Run, form: Any, change: bool) -> None:
        """Runs change only through the lifecycle service (a plain save could undo a transition)."""

    @admin.display(description="session", ordering="session__key")
    def session_link(self, obj: Any) -> str:
        url = reverse("admin:sessions_app_chatsession_change", args=[obj.session_id])
        return format_html('<a href="{}">{}</a>', url, obj.session_key)

    @admin.display(description="owner")
    def owner_name(self, obj: Any) -> str:
        return str(obj.owner_username)

    @admin.display(description="duration")
    def duration(self, obj: Run) -> str:
        return duration(obj.dispatched_at, obj.ended_at)

    @admin.display(description="calls (in order)")
    def tool_call_list(self, obj: Run) -> str:
        return tool_call_table(obj)

    @admin.display(description="timeline (newest first)")
    def timeline(self, obj: Run) -> str:
        """The run's transitions and its tool calls' and approvals' changes."""
        return timeline_table(timeline_events(LifecycleEvent.objects.filter(run_id=obj.pk)))

    @admin.display(description="attachments")
    def attachments_summary(self, obj: Run) -> str:
        items = obj.attachments or []
        return ", ".join(f"{a.get('fileName') or '-'} ({a.get('mimeType')})" for a in items) or "-"

    @admin.action(description="Abort selected runs (queued or active)", permissions=["change"])
    def abort_selected(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        if too_many(self, request, queryset, "end dead-process runs with `manage.py recover_runs`."):
            return
        aborted: list[str] = []
        skipped = Skipped()
        for run in list(self.annotate_rows(queryset, request).filter(state__in=(RunState.QUEUED, *ACTIVE_STATES))):
            try:
                outcome = session_services.abort(
                    owner_id=run.session_owner_id,
                    key=run.session_key,
                    run_id=run.run_id,
                    owner_process="",
                    stop_reason="operator",
                    actor=Actor.OPERATOR,
                )
            except LifecycleError as exc:  # its session was deleted meanwhile (and the run with it)
                skipped.add(exc)
                continue
            if outcome.aborted:
                aborted += outcome.run_ids
                self.log_change(request, run, "Aborted by operator")
        level = messages.SUCCESS if aborted else messages.WARNING
        self.message_user(request, f"Aborted {len(aborted)} run(s){skipped.suffix()}.", level)
