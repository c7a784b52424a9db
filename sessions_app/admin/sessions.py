"""Chat sessions: filters for stuck and failed ones, their runs inline, and the operator actions."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import F, Q, QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.text import Truncator

from sessions_app import operator_reads, statements
from sessions_app.admin.common import (
    RUN_HEAVY_FIELDS,
    RUNS_SHOWN,
    RowAnnotationsMixin,
    Skipped,
    duration,
    live_ids,
    skip_reason,
    timeline_events,
    timeline_table,
    too_many,
)
from sessions_app.lifecycle import LifecycleError, operators
from sessions_app.lifecycle import sessions as session_services
from sessions_app.models import (
    Actor,
    ChatSession,
    LifecycleEvent,
    Message,
    Run,
    RunState,
    SessionStatus,
)
from sessions_app.process import live_process_ids


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


class MarkFailedForm(forms.Form):
    reason = forms.CharField(
        min_length=3,
        max_length=500,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="Recorded as the run's error and in the session's audit timeline.",
    )


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


@admin.register(ChatSession)
class ChatSessionAdmin(RowAnnotationsMixin, admin.ModelAdmin):
    list_display = (
        "key",
        "owner_name",
        "agent_id",
        "status_badge",
        "last_run_key",
        "started_at",
        "ended_at",
        "runtime",
        "last_error",
        "updated_at",
    )
    list_display_links = ("key",)
    list_filter = (StatusFilter, StuckFilter, FailedRecentlyFilter, WaitingForFilter)
    search_fields = ("key", "label", "owner__username")
    search_help_text = "Session key or label (contains), owner username (contains), or an exact runId."
    ordering = ("-updated_at",)
    list_per_page = 50
    show_full_result_count = False  # a second COUNT of every session on each filtered page buys nothing
    inlines = (RunInline,)
    actions = ("abort_runs", "mark_failed", "reset_sessions", "delete_selected")
    fieldsets = (
        (None, {"fields": ("key", "owner", "agent_id", "label", "session_id", "status_badge", "version")}),
        (
            "Last run",
            {"fields": ("last_run_link", "started_at", "ended_at", "runtime", "aborted_last_run", "last_run_error")},
        ),
        ("Now", {"fields": ("active_run_link", "waiting_for", "queued_runs", "all_runs_link")}),
        ("Lifecycle audit", {"fields": ("timeline",)}),
        ("Times", {"fields": ("created_at", "updated_at")}),
    )
    readonly_fields = (
        "key",
        "owner",
        "agent_id",
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

    def _back(self, request: HttpRequest) -> HttpResponseRedirect | None:
        """After an action started from a session page, go back to that page."""
        pk = request.POST.get("agentgate_return", "")
        if pk.isdigit() and ChatSession.objects.filter(pk=int(pk)).exists():
            return HttpResponseRedirect(reverse("admin:sessions_app_chatsession_change", args=[int(pk)]))
        return None

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

    @admin.display(description="timeline (newest first)")
    def timeline(self, obj: Any) -> str:
        return timeline_table(timeline_events(LifecycleEvent.objects.filter(session_id=obj.pk)))

    # -- writes: only through the lifecycle service ----------------------------------------------------

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

    def log_deletions(self, request: HttpRequest, queryset: QuerySet[ChatSession]) -> Any:
        """Django logs a deletion before making it; `_delete_one` logs it with the delete instead, so a
        session someone else deleted meanwhile gets no entry saying this operator deleted it."""
        return []

    def _delete_one(self, request: HttpRequest, pk: int) -> None:
        """Log and delete one session in one transaction; the service's error (and no entry) if it is gone."""
        with transaction.atomic():
            super().log_deletions(request, ChatSession.objects.filter(pk=pk))
            session_services.delete_session(pk=pk, actor=Actor.OPERATOR)

    def _delete_each(self, request: HttpRequest, queryset: QuerySet[ChatSession]) -> tuple[int, Skipped]:
        deleted, skipped = 0, Skipped()
        for pk in list(queryset.values_list("pk", flat=True)):
            try:
                self._delete_one(request, pk)
            except LifecycleError as exc:
                skipped.add(exc)
            else:
                deleted += 1
        return deleted, skipped

    def delete_model(self, request: HttpRequest, obj: ChatSession) -> None:
        try:
            self._delete_one(request, obj.pk)
        except LifecycleError as exc:
            request._agentgate_skipped = skip_reason(exc)  # type: ignore[attr-defined]  # for response_delete

    def response_delete(self, request: HttpRequest, obj_display: str, obj_id: int) -> HttpResponse:
        reason = getattr(request, "_agentgate_skipped", None)
        if reason is None:
            return super().response_delete(request, obj_display, obj_id)
        self.message_user(request, f"Skipped the chat session “{obj_display}”: {reason}.", messages.WARNING)
        return HttpResponseRedirect(reverse("admin:sessions_app_chatsession_changelist"))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ChatSession]) -> None:
        self._delete_each(request, queryset)

    def get_deleted_objects(
        self, objs: Any, request: HttpRequest
    ) -> tuple[list[Any], dict[str, int], set[str], list[Any]]:
        """A summary with counts instead of every run, message and audit row listed."""
        pks = [o.pk for o in objs]
        shown = [str(o) for o in list(objs)[:50]]
        if len(pks) > 50:
            shown.append(f"… and {len(pks) - 50} more")
        counts = {
            "chat sessions": len(pks),
            "runs": Run.objects.filter(session_id__in=pks).count(),
            "messages": Message.objects.filter(session_id__in=pks).count(),
            "lifecycle events": LifecycleEvent.objects.filter(session_id__in=pks).count(),
        }
        perms_needed = set() if self.has_delete_permission(request) else {"chat session"}
        return shown, counts, perms_needed, []

    @admin.action(description="Delete selected chat sessions", permissions=["delete"])
    def delete_selected(self, request: HttpRequest, queryset: QuerySet[ChatSession]) -> HttpResponse | None:
        """Django's delete confirmation, for at most GATEWAY_ADMIN_BULK_LIMIT sessions at a time.

        The confirmed delete is ours: Django's would count every selected row as deleted.
        """
        if too_many(self, request, queryset, "delete idle sessions with `manage.py prune_sessions`."):
            return None
        if not request.POST.get("post"):
            return django_delete_selected(self, request, queryset)
        if not self.has_delete_permission(request):
            raise PermissionDenied
        deleted, skipped = self._delete_each(request, queryset)
        level = messages.SUCCESS if deleted else messages.WARNING
        self.message_user(request, f"Deleted {deleted} chat session(s){skipped.suffix()}.", level)
        return None

    @admin.action(description="Abort active and queued runs", permissions=["change"])
    def abort_runs(self, request: HttpRequest, queryset: QuerySet[ChatSession]) -> HttpResponse | None:
        if too_many(
            self,
            request,
            queryset,
            "end dead-process runs with `manage.py recover_runs` and repair "
            "the rest with `manage.py gateway_doctor --fix`.",
        ):
            return None
        busy = queryset.filter(
            Q(active_run__isnull=False) | Q(pk__in=Run.objects.filter(state=RunState.QUEUED).values("session_id"))
        )
        sessions = runs = 0
        skipped = Skipped()
        for session in list(busy.only("pk", "key")):
            try:
                _session, killed = session_services.abort_all(
                    pk=session.pk, stop_reason="operator", actor=Actor.OPERATOR
                )
            except LifecycleError as exc:
                skipped.add(exc)
                continue
            if killed:
                sessions += 1
                runs += len(killed)
                self.log_change(request, session, f"Aborted runs: {', '.join(killed)}")
        if runs:
            text, level = f"Aborted {runs} run(s) in {sessions} session(s){skipped.suffix()}.", messages.SUCCESS
        else:
            text, level = f"No active or queued runs in the selected sessions{skipped.suffix()}.", messages.WARNING
        self.message_user(request, text, level)
        return self._back(request)

    @admin.action(description="Mark the active run failed…", permissions=["change"])
    def mark_failed(self, request: HttpRequest, queryset: QuerySet[ChatSession]) -> HttpResponse | None:
        if too_many(self, request, queryset, "repair stuck sessions with `manage.py gateway_doctor --fix`."):
            return None
        form = MarkFailedForm(request.POST if "apply" in request.POST else None)
        if form.is_bound and form.is_valid():
            reason = f"{form.cleaned_data['reason']} (by {request.user.get_username()})"
            done: list[str] = []
            skipped = Skipped()
            for session in list(queryset.filter(active_run__isnull=False).only("pk", "key")):
                try:
                    ended = operators.mark_failed(session.pk, reason_text=reason, actor=Actor.OPERATOR)
                except LifecycleError as exc:
                    skipped.add(exc)
                    continue
                if ended:
                    done += ended
                    self.log_change(request, session, f"Marked run {ended[0]} failed: {reason}")
            if done:
                text = f"Marked {len(done)} run(s) failed: {', '.join(done)}{skipped.suffix()}."
                self.message_user(request, text, messages.SUCCESS)
            else:
                text = f"None of the selected sessions had an active run{skipped.suffix()}."
                self.message_user(request, text, messages.WARNING)
            return self._back(request)
        context = {
            **self.admin_site.each_context(request),
            "title": "Mark the active run failed",
            "opts": self.model._meta,
            "form": form,
            "sessions": list(queryset.only("pk", "key", "status")[:100]),
            "count": queryset.count(),
            "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across", "0"),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "agentgate_return": request.POST.get("agentgate_return", ""),
        }
        return TemplateResponse(request, "admin/sessions_app/chatsession/mark_failed.html", context)

    @admin.action(description="Reset (abort runs, new sessionId)", permissions=["change"])
    def reset_sessions(self, request: HttpRequest, queryset: QuerySet[ChatSession]) -> HttpResponse | None:
        if too_many(self, request, queryset, "delete idle sessions with `manage.py prune_sessions`."):
            return None
        count = 0
        skipped = Skipped()
        for session in list(queryset.only("pk", "key")):
            try:
                _session, killed = session_services.reset_session(pk=session.pk, actor=Actor.OPERATOR)
            except LifecycleError as exc:
                skipped.add(exc)
                continue
            count += 1
            self.log_change(request, session, "Reset" + (f"; aborted {', '.join(killed)}" if killed else ""))
        level = messages.SUCCESS if count else messages.WARNING
        self.message_user(request, f"Reset {count} session(s){skipped.suffix()}.", level)
        return self._back(request)
