"""Chat sessions: the list (counts, search) and a session's page (its runs inline, the timeline, the label).

The filters are in `session_filters`, the operator actions in `session_actions`.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.db.models import F, QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator

from sessions_app import branches, operator_reads, statements
from sessions_app.admin.common import (
    RUN_HEAVY_FIELDS,
    RUNS_SHOWN,
    RowAnnotationsMixin,
    duration,
    live_ids,
    skip_reason,
    timeline_events,
    timeline_table,
)
from sessions_app.admin.session_actions import SessionActions
from sessions_app.admin.session_filters import FailedRecentlyFilter, StatusFilter, StuckFilter, WaitingForFilter
from sessions_app.lifecycle import LifecycleError
from sessions_app.lifecycle import sessions as session_services
from sessions_app.models import Actor, ChatSession, LifecycleEvent, Run
from sessions_app.process import live_process_ids


class RecentRunsFormSet(BaseInlineFormSet):
    """Only the newest RUNS_SHOWN runs: a session may hold thousands."""

    def get_queryset(self) -> Any:
        if not hasattr(self, "_recent"):
            self._recent = list(
                super().get_queryset().defer(*RUN_HEAVY_FIELDS).order_by("-queue_seq", "-id")[:RUNS_SHOWN]
            )
        return self._recent


class RunInline(admin.TabularInline):
    model = Run
    fk_name = "session"
    formset = RecentRunsFormSet
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = True
    verbose_name_plural = f"runs (newest {RUNS_SHOWN})"
    fields = readonly_fields = (
        "run_id",
        "state",
        "queue_seq",
        "owner_process",
        "created_at",
        "dispatched_at",
        "ended_at",
        "run_duration",
        "error_kind",
        "stop_reason",
        "short_error",
    )

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="duration")
    def run_duration(self, run: Run) -> str:
        return duration(run.dispatched_at, run.ended_at)

    @admin.display(description="error")
    def short_error(self, run: Run) -> str:
        return Truncator(run.error_message).chars(80)


def _branch_view(obj: ChatSession) -> branches.BranchView:
    """The session's branches as its page shows them, read once for both fields (two statements)."""
    view = getattr(obj, "_branch_view", None)
    if view is None:
        view = branches.branch_view(obj, limit=50)
        obj._branch_view = view  # type: ignore[attr-defined]
    return view


@admin.register(ChatSession)
class ChatSessionAdmin(RowAnnotationsMixin, SessionActions):
    list_display = (
        "key",
        "owner_name",
        "agent_id",
        "kind",
        "status_badge",
        "last_run_key",
        "started_at",
        "ended_at",
        "runtime",
        "last_error",
        "updated_at",
    )
    list_display_links = ("key",)
    list_filter = ("kind", StatusFilter, StuckFilter, FailedRecentlyFilter, WaitingForFilter)
    search_fields = ("key", "label", "owner__username")
    search_help_text = "Session key or label (contains), owner username (contains), or an exact runId."
    ordering = ("-updated_at",)
    list_per_page = 50
    show_full_result_count = False  # a second COUNT of every session on each filtered page buys nothing
    inlines = (RunInline,)
    actions = ("abort_runs", "mark_failed", "reset_sessions", "delete_selected")
    fieldsets = (
        (None, {"fields": ("key", "owner", "agent_id", "kind", "label", "session_id", "status_badge", "version")}),
        (
            "Last run",
            {"fields": ("last_run_link", "started_at", "ended_at", "runtime", "aborted_last_run", "last_run_error")},
        ),
        ("Now", {"fields": ("active_run_link", "waiting_for", "queued_runs", "all_runs_link")}),
        ("Transcript", {"fields": ("active_branch", "branch_ends")}),
        ("Lifecycle audit", {"fields": ("timeline",)}),
        ("Times", {"fields": ("created_at", "updated_at")}),
    )
    readonly_fields = (
        "key",
        "owner",
        "agent_id",
        "kind",
        "session_id",
        "status_badge",
        "version",
        "last_run_link",
        "started_at",
        "ended_at",
        "runtime",
        "aborted_last_run",
        "last_run_error",
        "active_run_link",
        "waiting_for",
        "queued_runs",
        "all_runs_link",
        "active_branch",
        "branch_ends",
        "timeline",
        "created_at",
        "updated_at",
    )

    def annotate_rows(self, queryset: QuerySet[Any], request: HttpRequest) -> QuerySet[Any]:
        return queryset.select_related("owner").annotate(
            owner_username=F("owner__username"),
            last_run_run_id=F("last_run__run_id"),
            active_run_run_id=F("active_run__run_id"),
            active_owner=F("active_run__owner_process"),
            active_since=F("active_run__dispatched_at"),
        )

    def decorate_rows(self, rows: list[Any], request: HttpRequest) -> None:
        """The stuck badge uses THE stuck definition (operator_reads), for just these rows: one query."""
        ids = [row.pk for row in rows]
        stuck = operator_reads.stuck_session_ids(live_ids(request), among=ids)
        queued = statements.queued_run_ids(ids)  # THE queue read; one query for the page
        for row in rows:
            row.is_stuck = row.pk in stuck
            row.has_queued = bool(queued.get(row.pk))

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[ChatSession], search_term: str
    ) -> tuple[QuerySet[ChatSession], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        # A UNION of ids, one indexed branch each (trigram GIN on key and label on PostgreSQL,
        # the run_id index, the users table), instead of an OR of LIKEs across a join.
        owners = get_user_model().objects.filter(username__icontains=term).values("pk")
        branches: list[QuerySet[Any]] = [
            ChatSession.objects.filter(key__icontains=term).values("pk"),
            ChatSession.objects.filter(label__icontains=term).values("pk"),
            ChatSession.objects.filter(owner__in=owners).values("pk"),
        ]
        if " " not in term:
            # runId: exact, through its own index (a LIKE over a million runs would scan them all).
            branches.append(Run.objects.filter(run_id=term).values("session_id"))
        first, *rest = branches
        return queryset.filter(pk__in=first.union(*rest)), False

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        counts = operator_reads.counts(live_ids(request))
        url = reverse("admin:sessions_app_chatsession_changelist")
        extra = {
            "agentgate_counts": [
                ("running", counts.running, f"{url}?status=running"),
                ("stuck", counts.stuck, f"{url}?stuck=yes"),
                ("failed (24 h)", counts.failed_24h, f"{url}?failed=24h"),
                ("live processes", counts.live_processes, reverse("admin:sessions_app_gatewayprocess_changelist")),
            ],
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra_context=extra)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra = {
            "agentgate_session_actions": [
                ("abort_runs", "Abort runs"),
                ("mark_failed", "Mark failed…"),
                ("reset_sessions", "Reset"),
            ],
            **(extra_context or {}),
        }
        return super().change_view(request, object_id, form_url, extra)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # sessions are created by clients

    # -- columns ------------------------------------------------------------------------------------

    @admin.display(description="owner", ordering="owner")  # by owner id: the (owner, key) index
    def owner_name(self, obj: Any) -> str:
        return str(obj.owner_username)

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: Any) -> str:
        status = obj.status or "never ran"
        if obj.waiting_for == "approval" and obj.active_run_id is not None:
            status = f"{status} · needs approval"
        if obj.is_stuck:
            return format_html('{} <strong style="color:#ba2121">· stuck</strong>', status)
        if obj.has_queued:
            return f"{status} (+queued)"
        return status

    @admin.display(description="last run", ordering="last_run")  # by run id: the last_run index, no join
    def last_run_key(self, obj: Any) -> str:
        return obj.last_run_run_id or "-"

    @admin.display(description="runtime")
    def runtime(self, obj: Any) -> str:
        return duration(obj.started_at, None if obj.active_run_id else obj.ended_at)

    @admin.display(description="last error")
    def last_error(self, obj: Any) -> str:
        return Truncator(obj.last_run_error).chars(60) or "-"

    def _run_link(self, run_pk: int | None, run_id: str | None) -> str:
        if run_pk is None:
            return "-"
        return format_html('<a href="{}">{}</a>', reverse("admin:sessions_app_run_change", args=[run_pk]), run_id)

    @admin.display(description="last run")
    def last_run_link(self, obj: Any) -> str:
        return self._run_link(obj.last_run_id, obj.last_run_run_id)

    @admin.display(description="active run")
    def active_run_link(self, obj: Any) -> str:
        if obj.active_run_id is None:
            return "-"
        live = obj.active_owner in live_process_ids()
        where = obj.active_owner or "unowned"
        return format_html(
            "{} on {} ({}), since {}",
            self._run_link(obj.active_run_id, obj.active_run_run_id),
            where,
            "alive" if live else "NOT alive",
            obj.active_since,
        )

    @admin.display(description="queued runs")
    def queued_runs(self, obj: Any) -> str:
        # the whole queue is read (bounded by GATEWAY_QUEUE_MAX), the first 20 shown
        ids = statements.queued_run_ids([obj.pk]).get(obj.pk, [])[:20]
        return ", ".join(ids) or "-"

    @admin.display(description="runs")
    def all_runs_link(self, obj: Any) -> str:
        url = reverse("admin:sessions_app_run_changelist")
        return format_html('<a href="{}?session__id__exact={}">all runs of this session</a>', url, obj.pk)

    @admin.display(description="active branch (newest 50)")
    def active_branch(self, obj: Any) -> str:
        """The conversation as its clients and its model see it: the active branch (`sessions_app.branches`)."""
        view = _branch_view(obj)
        if not view.shown:
            return "-"
        items = format_html_join("", "<li><b>{}</b> #{}: {}</li>", ((m.role, m.pk, m.headline) for m in view.shown))
        return format_html("<ol>{}</ol>", items)

    @admin.display(description="branches")
    def branch_ends(self, obj: Any) -> str:
        ends = _branch_view(obj).ends
        if len(ends) <= 1:
            return "one" if ends else "-"
        return ", ".join(
            f"#{b.leaf_id} ({b.message_count} messages{', active' if b.active else ''})" for b in ends[:20]
        )

    @admin.display(description="timeline (newest first)")
    def timeline(self, obj: Any) -> str:
        return timeline_table(timeline_events(LifecycleEvent.objects.filter(session_id=obj.pk)))

    # -- the label: only through the lifecycle service (actions: `session_actions`) --------------------

    def save_model(self, request: HttpRequest, obj: ChatSession, form: Any, change: bool) -> None:
        """Only the label is editable; it changes through `sessions.patch`'s service."""
        if change and "label" in form.changed_data:
            try:
                session_services.patch_session(pk=obj.pk, label=obj.label, actor=Actor.OPERATOR)
            except LifecycleError as exc:
                request._agentgate_skipped = skip_reason(exc)  # type: ignore[attr-defined]  # for response_change

    def log_change(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        if getattr(request, "_agentgate_skipped", None) is not None:
            return None  # the edit was not made: no "changed" entry
        return super().log_change(request, obj, message)

    def response_change(self, request: HttpRequest, obj: ChatSession) -> HttpResponse:
        reason = getattr(request, "_agentgate_skipped", None)
        if reason is None:
            return super().response_change(request, obj)
        self.message_user(request, f"Skipped the change of the chat session “{obj}”: {reason}.", messages.WARNING)
        return HttpResponseRedirect(reverse("admin:sessions_app_chatsession_changelist"))
