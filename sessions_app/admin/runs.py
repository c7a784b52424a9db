"""Runs: filters (waiting on approval among them), the run's tool calls and timeline, and aborting selected runs."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.db.models import F, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html

from sessions_app import operator_reads
from sessions_app.admin.common import (
    RUN_HEAVY_FIELDS,
    RowAnnotationsMixin,
    act_on_each,
    duration,
    timeline_events,
    timeline_table,
    too_many,
)
from sessions_app.admin.files import attachment_list
from sessions_app.admin.toolcalls import tool_call_table
from sessions_app.lifecycle import sessions as session_services
from sessions_app.models import (
    ACTIVE_STATES,
    Actor,
    LifecycleEvent,
    Run,
    RunErrorKind,
    RunState,
)

REQUEST_SHOWN_CHARS = 20_000  # of a run's HTTP request on its page (a whole chat may carry images)


class ErrorKindFilter(admin.SimpleListFilter):
    """Fixed choices: a field filter would read the distinct values of a million rows."""

    title = "error kind"
    parameter_name = "error_kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(k, k) for k in RunErrorKind.values]

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
        "surface",
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
    list_filter = ("state", "surface", ErrorKindFilter, WaitingOnApprovalFilter)
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
        "surface",
        "queue_mode",
        "queue_seq",
        "message",
        "reply",
        "attachments_summary",
        "http_request",
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
        """Each attachment: its name, type and size, and a link to read a stored file's bytes."""
        return attachment_list(obj.attachments or [])

    @admin.display(description="HTTP request")
    def http_request(self, obj: Run) -> str:
        """What an HTTP request gave the run (HTTP-API.md §14.3): its instructions, the earlier messages a
        stateless request brought (not turns of its session, so not in `chat.history`), tool results,
        parameters; client tools by name. Long texts are cut."""
        if not obj.request:
            return "-"
        shown = {k: v for k, v in obj.request.items() if v not in ("", [], {}, None, False)}
        if "client_tools" in shown:
            shown["client_tools"] = [tool.get("name") for tool in shown["client_tools"]]
        text = json.dumps(shown, indent=1, ensure_ascii=False)
        if len(text) > REQUEST_SHOWN_CHARS:
            text = text[:REQUEST_SHOWN_CHARS] + f"\n… ({len(text) - REQUEST_SHOWN_CHARS} more characters)"
        return format_html('<pre style="white-space: pre-wrap">{}</pre>', text)

    @admin.action(description="Abort selected runs (queued or active)", permissions=["change"])
    def abort_selected(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        if too_many(self, request, queryset, "end dead-process runs with `manage.py recover_runs`."):
            return

        def abort(run: Any) -> list[str] | None:
            outcome = session_services.abort(
                owner_id=run.session_owner_id,
                key=run.session_key,
                run_id=run.run_id,
                owner_process="",
                stop_reason="operator",
                actor=Actor.OPERATOR,
            )
            return outcome.run_ids if outcome.aborted else None

        rows = self.annotate_rows(queryset, request).filter(state__in=(RunState.QUEUED, *ACTIVE_STATES))
        acted = act_on_each(self, request, rows, abort, log=lambda run_ids: "Aborted by operator")
        acted.tell(self, request, f"Aborted {sum(len(run_ids) for run_ids in acted.done)} run(s)")
