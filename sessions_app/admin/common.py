"""What the model admins share: row annotations in one query per page, bulk-action limits, per-row
actions and their skipped rows, the audit timeline table."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator

from sessions_app import operator_reads
from sessions_app.lifecycle import LifecycleError, SessionNotFound
from sessions_app.models import LifecycleEvent
from sessions_app.process import live_process_ids

RUNS_SHOWN = 50  # runs inline on the session page; the rest are one click away

TIMELINE_SHOWN = 200  # audit rows on the session and run pages

# Columns never needed by a list or an inline: keep them out of the SELECT.
RUN_HEAVY_FIELDS = ("message", "reply", "attachments", "body_hash", "request")

RowT = TypeVar("RowT")
DoneT = TypeVar("DoneT")


def duration(start: datetime | None, end: datetime | None) -> str:
    if start is None:
        return "-"
    running = end is None
    seconds = max(0.0, ((end or timezone.now()) - start).total_seconds())
    if seconds < 1:
        text = f"{int(seconds * 1000)} ms"
    elif seconds < 120:
        text = f"{seconds:.1f} s"
    elif seconds < 7200:
        text = f"{seconds / 60:.1f} min"
    else:
        text = f"{seconds / 3600:.1f} h"
    return f"{text} (running)" if running else text


class EstimatedCountPaginator(Paginator):
    """Counts cheaply: large counts are the planner's estimate on PostgreSQL
    (`operator_reads.estimated_count`), so a page of a big table reads one page of rows."""

    def __init__(self, object_list: Any, per_page: int, **kwargs: Any) -> None:
        super().__init__(object_list, per_page, **kwargs)
        self.exact = True

    @cached_property
    def count(self) -> int:  # type: ignore[override]
        number, self.exact = operator_reads.estimated_count(self.object_list)  # type: ignore[arg-type]
        return number


class PageAnnotatedPaginator(EstimatedCountPaginator):
    """Counts cheaply, then fetches a page as ids first and annotates only those rows.

    Annotations that reach into related tables add joins; applied before LIMIT/OFFSET
    they make the database join every row of a 1M-row table to return 50. The page's
    ids come from the plain, index-ordered query; the annotated query reads just them.
    """

    def __init__(self, object_list: Any, per_page: int, rows: Callable[[Any], list[Any]], **kwargs: Any) -> None:
        super().__init__(object_list, per_page, **kwargs)
        self.rows = rows

    def page(self, number: Any) -> Any:
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        top = bottom + self.per_page
        if top + self.orphans >= self.count:
            top = self.count
        return self._get_page(self.rows(self.object_list[bottom:top]), number, self)  # type: ignore[attr-defined]


class RowAnnotatedChangeList(ChangeList):
    """A result list that fits on one page skips the paginator: fetch its rows the same way."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        if isinstance(self.result_list, QuerySet):
            self.result_list = self.model_admin.page_rows(self.result_list, request)  # type: ignore[attr-defined]


class ReadOnlyMixin:
    """A record operators look at and never edit (its rows change through the services alone)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class RowAnnotationsMixin:
    """ModelAdmin helper: `annotate_rows(qs, request)` (joins) and `decorate_rows(rows, request)` (set-based
    lookups, one query each) apply to the listed rows and the object page only."""

    def annotate_rows(self, queryset: QuerySet[Any], request: HttpRequest) -> QuerySet[Any]:
        return queryset

    def decorate_rows(self, rows: list[Any], request: HttpRequest) -> None:
        return None

    def page_rows(self, queryset: QuerySet[Any], request: HttpRequest) -> list[Any]:
        """The rows of one page, in the page's order: ids first, then the annotated rows of just those ids."""
        ids = list(queryset.values_list("pk", flat=True))
        if not ids:
            return []
        model = queryset.model
        by_pk = {obj.pk: obj for obj in self.annotate_rows(model._default_manager.filter(pk__in=ids), request)}
        rows = [by_pk[pk] for pk in ids if pk in by_pk]
        self.decorate_rows(rows, request)
        return rows

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return RowAnnotatedChangeList

    def get_paginator(
        self, request: HttpRequest, queryset: Any, per_page: int, orphans: int = 0, allow_empty_first_page: bool = True
    ) -> Paginator:
        return PageAnnotatedPaginator(
            queryset,
            per_page,
            lambda qs: self.page_rows(qs, request),
            orphans=orphans,
            allow_empty_first_page=allow_empty_first_page,
        )

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        queryset = self.annotate_rows(self.get_queryset(request), request)  # type: ignore[attr-defined]
        model = queryset.model
        field = model._meta.pk if from_field is None else model._meta.get_field(from_field)
        try:
            obj = queryset.get(**{field.name: field.to_python(object_id)})
        except (model.DoesNotExist, ValidationError, ValueError):
            return None
        self.decorate_rows([obj], request)
        return obj


def bulk_limit() -> int:
    return int(settings.GATEWAY_ADMIN_BULK_LIMIT)


def too_many(model_admin: admin.ModelAdmin[Any], request: HttpRequest, queryset: QuerySet[Any], hint: str) -> bool:
    """Bulk actions act on at most GATEWAY_ADMIN_BULK_LIMIT rows per request; more is a command's job."""
    limit = bulk_limit()
    selected = len(queryset.order_by().values_list("pk", flat=True)[: limit + 1])
    if selected <= limit:
        return False
    model_admin.message_user(
        request,
        f"More than {limit} rows selected: the admin acts on at most {limit} at a time (one request must not "
        f"run for minutes). Narrow the selection, or {hint}",
        messages.ERROR,
    )
    return True


def skip_reason(exc: LifecycleError) -> str:
    """Why a row was left alone, as the operator's message says it."""
    return "deleted meanwhile" if isinstance(exc, SessionNotFound) else exc.message


class Skipped:
    """Rows an action left alone, counted by reason.

    Each row is its own lifecycle call: a session deleted (or changed) by a client or
    another operator after the change list was built fails that row's call with the
    service's own error. The action goes on with the other rows and says what it skipped.
    """

    def __init__(self) -> None:
        self.reasons: Counter[str] = Counter()

    def add(self, exc: LifecycleError) -> None:
        self.reasons[skip_reason(exc)] += 1

    def suffix(self) -> str:
        """`; skipped 1: deleted meanwhile`, or "" when nothing was skipped."""
        if not self.reasons:
            return ""
        total = sum(self.reasons.values())
        if len(self.reasons) == 1:
            return f"; skipped {total}: {next(iter(self.reasons))}"
        return f"; skipped {total}: " + ", ".join(f"{n} {why}" for why, n in self.reasons.most_common())


@dataclass
class Acted(Generic[DoneT]):
    """What a per-row action did: what its call returned for each row it changed, and the rows it skipped."""

    done: list[DoneT]
    skipped: Skipped

    def tell(self, model_admin: admin.ModelAdmin[Any], request: HttpRequest, text: str) -> None:
        """The action's one message: `text`, then what it skipped; a warning when it changed nothing."""
        level = messages.SUCCESS if self.done else messages.WARNING
        model_admin.message_user(request, f"{text}{self.skipped.suffix()}.", level)


def act_on_each(
    model_admin: admin.ModelAdmin[Any],
    request: HttpRequest,
    rows: Iterable[RowT],
    call: Callable[[RowT], DoneT | None],
    *,
    log: Callable[[DoneT], str] | None = None,
) -> Acted[DoneT]:
    """An action's rows, one lifecycle call each (`call(row)`): what it did, or None when it found
    nothing to do. A row whose call fails (`LifecycleError`) is skipped and counted by reason; with
    `log`, each row changed gets its change-log entry (`log(what the call did)`)."""
    done: list[DoneT] = []
    skipped = Skipped()
    for row in list(rows):
        try:
            result = call(row)
        except LifecycleError as exc:  # deleted or changed meanwhile: the other rows go on
            skipped.add(exc)
            continue
        if result is None:
            continue
        done.append(result)
        if log is not None:
            model_admin.log_change(request, row, log(result))
    return Acted(done, skipped)


def live_ids(request: HttpRequest) -> set[str]:
    """Live process ids, read once per request."""
    cached: set[str] | None = getattr(request, "_agentgate_live", None)
    if cached is None:
        cached = live_process_ids()
        request._agentgate_live = cached  # type: ignore[attr-defined]
    return cached


# --- the audit timeline -------------------------------------------------------------------------------


def timeline_events(queryset: QuerySet[LifecycleEvent]) -> list[LifecycleEvent]:
    """The newest TIMELINE_SHOWN audit rows of `queryset`, with their run's and tool call's ids (one query)."""
    return list(
        queryset.select_related("run", "tool_call")
        .only(
            "created_at",
            "actor",
            "actor_name",
            "reason",
            "from_state",
            "to_state",
            "detail",
            "run__run_id",
            "tool_call__call_id",
        )
        .order_by("-id")[:TIMELINE_SHOWN]
    )


def _tool_call_link(event: LifecycleEvent) -> str:
    if event.tool_call_id is None or event.tool_call is None:
        return ""
    url = reverse("admin:sessions_app_toolcall_change", args=[event.tool_call_id])
    return format_html('<a href="{}">{}</a>', url, event.tool_call.call_id)


def timeline_table(events: list[LifecycleEvent]) -> str:
    """Audit rows as a table, newest first: run transitions, session changes, tool calls and approvals
    (the tool call column links to the call's admin page; the actor names who decided an approval)."""
    if not events:
        return "no audit rows"
    rows = format_html_join(
        "\n",
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} → {}</td><td>{}</td></tr>",
        (
            (
                timezone.localtime(e.created_at).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3],
                f"{e.actor} ({e.actor_name})" if e.actor_name else e.actor,
                e.reason,
                e.run.run_id if e.run else "",
                _tool_call_link(e),
                e.from_state or "·",
                e.to_state or "·",
                Truncator(e.detail).chars(200),
            )
            for e in events
        ),
    )
    return format_html(
        '<table class="agentgate-timeline"><thead><tr><th>time</th><th>actor</th><th>reason</th>'
        "<th>run</th><th>tool call</th><th>transition</th><th>detail</th></tr></thead><tbody>{}</tbody></table>",
        rows,
    )
