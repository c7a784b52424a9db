"""Tool calls (TOOLS.md §13): a read-only list and page, and the table of a run's calls on its page.

Nothing here changes a call or an approval: their states change only through the lifecycle
(`sessions_app.lifecycle.toolcalls`), so the admin offers no add, change or delete. A page of calls
costs a fixed number of queries: the page's ids first, then those rows with their run, session,
owner and approval joined in, and their arguments and results cut short by the database (a call
may carry 64 KiB of each).
"""

from __future__ import annotations

from typing import Any, cast

from django.contrib import admin
from django.db.models import F, QuerySet
from django.db.models.functions import Length, Substr
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from sessions_app.admin.common import ReadOnlyMixin, RowAnnotationsMixin, duration, timeline_events, timeline_table
from sessions_app.models import (
    TOOL_ERROR_KIND_STATES,
    TOOL_OPEN_STATES,
    LifecycleEvent,
    Run,
    ToolApproval,
    ToolCall,
    ToolCallState,
    ToolErrorKind,
)

PREVIEW_CHARS = 120  # arguments and results in lists and tables
FULL_TEXT_CHARS = 256 * 1024  # arguments and result on a call's own page (results are capped far below this)
TOOL_CALLS_SHOWN = 100  # calls in the table on a run's page; the rest are one click away

UNKNOWN_NOTE = (
    "The gateway stopped while this tool ran: whether it took effect is not known, and the gateway "
    "never runs it again. Check the tool's side effects by hand (docs/tools.md, “unknown”)."
)
CLIENT_NOTE = (
    "A function tool of the API client that made the request: handed to that client, which runs it and sends "
    "its result with its next request. The gateway never runs it."
)


def with_previews(queryset: QuerySet[ToolCall]) -> QuerySet[ToolCall]:
    """The calls without their full arguments and result: the first PREVIEW_CHARS of each, and their lengths."""
    return queryset.defer("arguments", "result").annotate(
        args_head=Substr("arguments", 1, PREVIEW_CHARS),
        args_chars=Length("arguments"),
        result_head=Substr("result", 1, PREVIEW_CHARS),
        result_chars=Length("result"),
    )


def preview(head: str | None, chars: int | None) -> str:
    """One line of text: the head, and how long the whole is when it was cut."""
    if not chars:
        return ""
    line = " ".join((head or "").split())
    return line if chars <= PREVIEW_CHARS else f"{line}… ({chars} chars)"


def approval_of(call: ToolCall) -> ToolApproval | None:
    """The call's approval as loaded with it (`select_related("approval")`: no query here)."""
    try:
        return call.approval
    except ToolApproval.DoesNotExist:
        return None


def approval_text(call: ToolCall) -> str:
    """`-` (none), `pending (expires …)`, or the decision and who took it."""
    approval = approval_of(call)
    if approval is None:
        return "-"
    if approval.pending:
        return f"pending (expires {timezone.localtime(approval.expires_at):%Y-%m-%d %H:%M:%S})"
    return f"{approval.decision} by {approval.decided_by or '-'}"


def error_text(call: ToolCall) -> str:
    if not call.is_error:
        return "-"
    return f"error: {call.error_kind}" if call.error_kind else "error"


def call_link(call: ToolCall) -> str:
    return format_html(
        '<a href="{}">{}</a>', reverse("admin:sessions_app_toolcall_change", args=[call.pk]), call.call_id
    )


def tool_call_table(run: Run) -> str:
    """The run's calls in order (the first TOOL_CALLS_SHOWN), one query with their approvals."""
    calls = list(
        with_previews(ToolCall.objects.filter(run_id=run.pk))
        .select_related("approval")
        .order_by("seq")[:TOOL_CALLS_SHOWN]
    )
    if not calls:
        return "no tool calls"
    rows = format_html_join(
        "\n",
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td><td>{}</td><td>{}</td></tr>",
        (
            (
                f"{c.seq} (step {c.step})",
                call_link(c),
                c.name,
                c.state,
                error_text(c),
                preview(c.args_head, c.args_chars),  # type: ignore[attr-defined]
                preview(c.result_head, c.result_chars),  # type: ignore[attr-defined]
                _time(c.started_at),
                _time(c.ended_at),
                duration(c.started_at, c.ended_at) if c.started_at else "-",
                approval_text(c),
            )
            for c in calls
        ),
    )
    more = ""
    if run.tool_calls > len(calls):
        url = reverse("admin:sessions_app_toolcall_changelist")
        more = format_html(
            '<p><a href="{}?run__id__exact={}">all {} tool calls of this run</a></p>', url, run.pk, run.tool_calls
        )
    return format_html(
        '<table class="agentgate-tool-calls"><thead><tr><th>seq</th><th>toolCallId</th><th>name</th><th>state</th>'
        "<th>error</th><th>arguments</th><th>result</th><th>started</th><th>ended</th><th>duration</th>"
        "<th>approval</th></tr></thead><tbody>{}</tbody></table>{}",
        rows,
        more,
    )


def _time(value: Any) -> str:
    return "-" if value is None else timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S")


class ToolStateFilter(admin.SimpleListFilter):
    """The call states, and "open" (not ended yet: normally only while its run is active)."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        labels: dict[str, str] = {ToolCallState.CLIENT: "Handed to the API client"}
        states = [(value, labels.get(value, label)) for value, label in ToolCallState.choices]
        return [("open", "Open (pending, waiting for approval, running)"), *states]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value == "open":
            return queryset.filter(state__in=TOOL_OPEN_STATES)
        if value in ToolCallState.values:
            return queryset.filter(state=value)
        return queryset


class ToolErrorKindFilter(admin.SimpleListFilter):
    """Fixed choices (a field filter would read the distinct values of every call). Each kind
    belongs to one terminal state, which is filtered too: the `(state, ended_at)` index then
    narrows the rows (error_kind has no index of its own)."""

    title = "error kind"
    parameter_name = "error_kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(k, k) for k in ToolErrorKind.values]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        kind = self.value()
        if kind in TOOL_ERROR_KIND_STATES:
            return queryset.filter(state=TOOL_ERROR_KIND_STATES[kind], error_kind=kind)
        return queryset


@admin.register(ToolCall)
class ToolCallAdmin(ReadOnlyMixin, RowAnnotationsMixin, admin.ModelAdmin):
    """Read-only: a call changes only through the lifecycle (it runs at most once, ends once)."""

    list_display = (
        "call_id",
        "tool_name",
        "state",
        "error",
        "run_link",
        "session_link",
        "owner_name",
        "approval_column",
        "created_at",
        "ended_at",
        "call_duration",
        "arguments_preview",
        "result_preview",
    )
    list_filter = (ToolStateFilter, ToolErrorKindFilter)
    search_fields = ("=call_id",)  # enables the search box; the lookup itself is below
    search_help_text = "Exact toolCallId, exact runId, or a tool's name (server.tool, or the tool alone)."
    ordering = ("-id",)
    sortable_by = ("ended_at",)  # the (ended_at, id) index; other columns would sort every call
    list_per_page = 50
    show_full_result_count = False
    actions = None
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "call_id",
                    "tool_name",
                    "state_text",
                    "error",
                    "run_link",
                    "session_link",
                    "owner_name",
                    "seq",
                    "step",
                    "model_call_id",
                )
            },
        ),
        ("Arguments and result", {"fields": ("arguments_text", "result_text")}),
        ("Approval", {"fields": ("approval_details",)}),
        ("Times", {"fields": ("created_at", "started_at", "ended_at", "call_duration")}),
        ("Lifecycle audit", {"fields": ("timeline",)}),
    )
    # every field shown is read-only: state changes only through the lifecycle
    readonly_fields = tuple(name for _title, options in fieldsets for name in cast(tuple[str, ...], options["fields"]))

    def annotate_rows(self, queryset: QuerySet[Any], request: HttpRequest) -> QuerySet[Any]:
        qs = queryset.select_related("approval").annotate(
            run_run_id=F("run__run_id"),
            session_pk=F("run__session_id"),
            session_key=F("run__session__key"),
            owner_username=F("run__session__owner__username"),
        )
        match = request.resolver_match
        if match is not None and (match.url_name or "").endswith("_changelist"):
            qs = with_previews(qs)
        return qs

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[ToolCall], search_term: str
    ) -> tuple[QuerySet[ToolCall], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        # A UNION of ids: the unique call_id, the runs' run_id index then the calls' run index,
        # and the tool's name (no index of its own: the calls are read newest first until a page is full).
        branches: list[QuerySet[Any]] = [
            ToolCall.objects.filter(call_id=term).values("pk"),
            ToolCall.objects.filter(run_id__in=Run.objects.filter(run_id=term).values("pk")).values("pk"),
        ]
        server, dot, tool = term.partition(".")
        by_name = ToolCall.objects.filter(server=server, tool=tool) if dot else ToolCall.objects.filter(tool=term)
        branches.append(by_name.values("pk"))
        first, *rest = branches
        return queryset.filter(pk__in=first.union(*rest)), False

    # -- columns --------------------------------------------------------------------------------------

    @admin.display(description="name")
    def tool_name(self, obj: ToolCall) -> str:
        return obj.name

    @admin.display(description="state")
    def state_text(self, obj: ToolCall) -> str:
        if obj.state == ToolCallState.UNKNOWN:
            return format_html("<strong>unknown</strong> — {}", UNKNOWN_NOTE)
        if obj.state == ToolCallState.CLIENT:
            return format_html("<strong>client</strong> — {}", CLIENT_NOTE)
        return obj.state

    @admin.display(description="error")
    def error(self, obj: ToolCall) -> str:
        return error_text(obj)

    @admin.display(description="run")
    def run_link(self, obj: Any) -> str:
        url = reverse("admin:sessions_app_run_change", args=[obj.run_id])
        return format_html('<a href="{}">{}</a>', url, obj.run_run_id)

    @admin.display(description="session")
    def session_link(self, obj: Any) -> str:
        url = reverse("admin:sessions_app_chatsession_change", args=[obj.session_pk])
        return format_html('<a href="{}">{}</a>', url, obj.session_key)

    @admin.display(description="owner")
    def owner_name(self, obj: Any) -> str:
        return str(obj.owner_username)

    @admin.display(description="approval")
    def approval_column(self, obj: ToolCall) -> str:
        return approval_text(obj)

    @admin.display(description="duration")
    def call_duration(self, obj: ToolCall) -> str:
        return duration(obj.started_at, obj.ended_at) if obj.started_at else "-"

    @admin.display(description="arguments")
    def arguments_preview(self, obj: Any) -> str:
        return preview(obj.args_head, obj.args_chars) or "-"

    @admin.display(description="result")
    def result_preview(self, obj: Any) -> str:
        return preview(obj.result_head, obj.result_chars) or "-"

    @admin.display(description="arguments (as the model sent them)")
    def arguments_text(self, obj: ToolCall) -> str:
        return _pre(obj.arguments)

    @admin.display(description="result (as the model, the events and history saw it)")
    def result_text(self, obj: ToolCall) -> str:
        return _pre(obj.result)

    @admin.display(description="approval")
    def approval_details(self, obj: ToolCall) -> str:
        approval = approval_of(obj)
        if approval is None:
            return "none (the call did not need one)"
        return format_html(
            "{} — decision: {}{}; requested {}, expires {}, resolved {}",
            approval.approval_id,
            approval.decision or "pending",
            f" by {approval.decided_by}" if approval.decided_by else "",
            _time(approval.created_at),
            _time(approval.expires_at),
            _time(approval.resolved_at),
        )

    @admin.display(description="timeline (newest first)")
    def timeline(self, obj: ToolCall) -> str:
        return timeline_table(timeline_events(LifecycleEvent.objects.filter(tool_call_id=obj.pk)))


def _pre(text: str) -> str:
    """Untrusted text, escaped, kept as it was written (and cut on a huge one)."""
    if not text:
        return "-"
    if len(text) > FULL_TEXT_CHARS:
        text = f"{text[:FULL_TEXT_CHARS]}\n[… {len(text) - FULL_TEXT_CHARS} more characters not shown]"
    return format_html("<pre>{}</pre>", text)
