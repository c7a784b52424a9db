"""The chat sessions' operator actions: abort runs, mark the active run failed, reset, delete.

Each selected session is one lifecycle call (`common.act_on_each`), never a bulk write, so every
change writes its audit row and reaches connected clients; a session deleted or changed meanwhile
is skipped and said so. An action started from a session's page goes back to that page.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from sessions_app.admin.common import act_on_each, skip_reason, too_many
from sessions_app.lifecycle import LifecycleError, operators
from sessions_app.lifecycle import sessions as session_services
from sessions_app.models import Actor, ChatSession, LifecycleEvent, Message, Run, RunState


class MarkFailedForm(forms.Form):
    reason = forms.CharField(
        min_length=3,
        max_length=500,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="Recorded as the run's error and in the session's audit timeline.",
    )


class SessionActions(admin.ModelAdmin):
    """The session admin's writes besides the label: each through the lifecycle service."""

    def _back(self, request: HttpRequest) -> HttpResponseRedirect | None:
        """After an action started from a session page, go back to that page."""
        pk = request.POST.get("agentgate_return", "")
        if pk.isdigit() and ChatSession.objects.filter(pk=int(pk)).exists():
            return HttpResponseRedirect(reverse("admin:sessions_app_chatsession_change", args=[int(pk)]))
        return None

    # -- delete ---------------------------------------------------------------------------------------

    def log_deletions(self, request: HttpRequest, queryset: QuerySet[ChatSession]) -> Any:
        """Django logs a deletion before making it; `_delete_one` logs it with the delete instead, so a
        session someone else deleted meanwhile gets no entry saying this operator deleted it."""
        return []

    def _delete_one(self, request: HttpRequest, pk: int) -> int:
        """Log and delete one session in one transaction; the service's error (and no entry) if it is gone."""
        with transaction.atomic():
            super().log_deletions(request, ChatSession.objects.filter(pk=pk))
            session_services.delete_session(pk=pk, actor=Actor.OPERATOR)
        return pk

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
        act_on_each(self, request, queryset.values_list("pk", flat=True), lambda pk: self._delete_one(request, pk))

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
        pks = queryset.values_list("pk", flat=True)
        acted = act_on_each(self, request, pks, lambda pk: self._delete_one(request, pk))
        acted.tell(self, request, f"Deleted {len(acted.done)} chat session(s)")
        return None

    # -- runs -----------------------------------------------------------------------------------------

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

        def abort_all(session: ChatSession) -> list[str] | None:
            _session, killed = session_services.abort_all(pk=session.pk, stop_reason="operator", actor=Actor.OPERATOR)
            return killed or None

        acted = act_on_each(
            self, request, busy.only("pk", "key"), abort_all, log=lambda killed: f"Aborted runs: {', '.join(killed)}"
        )
        runs = sum(len(killed) for killed in acted.done)
        if runs:
            acted.tell(self, request, f"Aborted {runs} run(s) in {len(acted.done)} session(s)")
        else:
            acted.tell(self, request, "No active or queued runs in the selected sessions")
        return self._back(request)

    @admin.action(description="Mark the active run failed…", permissions=["change"])
    def mark_failed(self, request: HttpRequest, queryset: QuerySet[ChatSession]) -> HttpResponse | None:
        if too_many(self, request, queryset, "repair stuck sessions with `manage.py gateway_doctor --fix`."):
            return None
        form = MarkFailedForm(request.POST if "apply" in request.POST else None)
        if not (form.is_bound and form.is_valid()):
            return self._mark_failed_page(request, queryset, form)
        reason = f"{form.cleaned_data['reason']} (by {request.user.get_username()})"
        acted = act_on_each(
            self,
            request,
            queryset.filter(active_run__isnull=False).only("pk", "key"),
            lambda session: operators.mark_failed(session.pk, reason_text=reason, actor=Actor.OPERATOR) or None,
            log=lambda ended: f"Marked run {ended[0]} failed: {reason}",
        )
        ended = [run_id for run_ids in acted.done for run_id in run_ids]
        if ended:
            acted.tell(self, request, f"Marked {len(ended)} run(s) failed: {', '.join(ended)}")
        else:
            acted.tell(self, request, "None of the selected sessions had an active run")
        return self._back(request)

    def _mark_failed_page(
        self, request: HttpRequest, queryset: QuerySet[ChatSession], form: MarkFailedForm
    ) -> TemplateResponse:
        """The form asking for the reason, over the selected sessions."""
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
        acted = act_on_each(
            self,
            request,
            queryset.only("pk", "key"),
            lambda session: session_services.reset_session(pk=session.pk, actor=Actor.OPERATOR)[1],
            log=lambda killed: "Reset" + (f"; aborted {', '.join(killed)}" if killed else ""),
        )
        acted.tell(self, request, f"Reset {len(acted.done)} session(s)")
        return self._back(request)
