"""API keys: add one for a user with its scopes (the raw key shown once), revoke, filter by state and
scope, search by user or prefix. Keys are made and revoked by `sessions_app.tokens` alone; a key is
never edited or deleted here (revoking is what closes its connections), and its hash is never shown."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from sessions_app import tokens
from sessions_app.admin.common import EstimatedCountPaginator, too_many
from sessions_app.models import ApiToken, KeyScope, default_key_scopes

CHANGELIST = "admin:sessions_app_apitoken_changelist"


class TokenStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("active", "Active"), ("revoked", "Revoked")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "active":
            return queryset.filter(revoked_at__isnull=True)
        if self.value() == "revoked":
            return queryset.filter(revoked_at__isnull=False)
        return queryset


class KeyScopeFilter(admin.SimpleListFilter):
    title = "scope"
    parameter_name = "scope"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(scope.value, f"has {scope.value}") for scope in KeyScope] + [("read-only", "read only")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return tokens.having_scope(queryset, value) if value else queryset


class KeyAddForm(forms.ModelForm):
    """A new key: its user, name and scopes, checked by the rules every new key meets (`tokens.check_key`)."""

    scopes = forms.MultipleChoiceField(
        choices=KeyScope.choices,
        initial=default_key_scopes,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Every key has read; admin only for a staff user's key (and it acts only while they are staff).",
    )

    class Meta:
        model = ApiToken
        fields = ("user", "name", "scopes")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        user = data.get("user")
        if user is not None:
            try:
                tokens.check_key(user, name=data.get("name") or "", scopes=data.get("scopes") or [])
            except tokens.KeyRefused as exc:
                self.add_error(exc.field if exc.field in self.fields else None, exc.message)
        return data


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("shown_prefix", "user", "name", "scope_list", "created_at", "last_used_at", "revoked_at", "active")
    list_filter = (TokenStateFilter, KeyScopeFilter)
    list_select_related = ("user",)
    search_fields = ("prefix",)  # enables the search box; the lookup itself is below
    search_help_text = "A key's printed prefix (agt_…, from its start), or a username (contains)."
    autocomplete_fields = ("user",)
    actions = ("revoke",)
    ordering = ("-id",)  # newest first by the primary key: no sort of every key
    sortable_by = ()
    list_per_page = 50
    show_full_result_count = False
    form = KeyAddForm
    readonly_fields = ("user", "name", "shown_prefix", "scope_list", "created_at", "last_used_at", "revoked_at")

    def get_paginator(
        self, request: HttpRequest, queryset: Any, per_page: int, orphans: int = 0, allow_empty_first_page: bool = True
    ) -> Paginator:
        return EstimatedCountPaginator(
            queryset, per_page, orphans=orphans, allow_empty_first_page=allow_empty_first_page
        )

    def get_queryset(self, request: HttpRequest) -> QuerySet[ApiToken]:
        return super().get_queryset(request).defer("token_hash")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[ApiToken], search_term: str
    ) -> tuple[QuerySet[ApiToken], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        users = get_user_model().objects.filter(username__icontains=term).values("pk")
        return queryset.filter(Q(prefix__startswith=term) | Q(user_id__in=users)), False

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "user" and not request.user.is_superuser:
            # A key acts as its user: only superusers may mint one for someone else.
            kwargs["queryset"] = get_user_model().objects.filter(pk=request.user.pk or 0)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_fields(self, request: HttpRequest, obj: ApiToken | None = None) -> Any:
        return ("user", "name", "scopes") if obj is None else self.readonly_fields

    def get_readonly_fields(self, request: HttpRequest, obj: ApiToken | None = None) -> Any:
        return () if obj is None else self.readonly_fields

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        if obj is not None:
            kwargs["form"] = forms.ModelForm  # a made key is only looked at
        return super().get_form(request, obj, change, **kwargs)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A deleted row would skip the revocation its open connections are closed by: revoke instead.
        return False

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra = {"show_save": False, "show_save_and_continue": False, **(extra_context or {})}
        return super().change_view(request, object_id, form_url, extra)

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        """Only new keys are saved, through `tokens.issue_token`; a key is never edited."""
        if change:
            return
        if not request.user.is_superuser and obj.user_id != request.user.pk:
            raise PermissionDenied("only superusers may create keys for other users")
        try:
            token, raw = tokens.issue_token(obj.user, name=obj.name, scopes=form.cleaned_data.get("scopes") or [])
        except tokens.KeyRefused as exc:  # the form's check passed, then another request took the last place
            obj._refused = exc.message  # type: ignore[attr-defined]  # said by response_add
            return
        obj.pk, obj.prefix, obj.created_at, obj.scopes = token.pk, token.prefix, token.created_at, token.scopes
        obj._state.adding = False
        obj._state.db = token._state.db
        obj._raw_token = raw  # type: ignore[attr-defined]  # shown once by response_add

    def log_addition(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        return None if obj.pk is None else super().log_addition(request, obj, message)

    def response_add(self, request: HttpRequest, obj: ApiToken, post_url_continue: str | None = None) -> HttpResponse:
        """The raw key on its own page, this once: never stored, and never in a message (messages are
        kept in a cookie or the session until shown)."""
        refused = getattr(obj, "_refused", None)
        if refused:
            self.message_user(request, f"No key made: {refused}.", messages.ERROR)
            return HttpResponseRedirect(reverse(CHANGELIST))
        context = {
            **self.admin_site.each_context(request),
            "title": "API key created",
            "opts": self.model._meta,
            "token": obj,
            "raw_token": getattr(obj, "_raw_token", ""),
            "changelist_url": reverse(CHANGELIST),
        }
        response = TemplateResponse(request, "admin/sessions_app/apitoken/token_created.html", context)
        response["Cache-Control"] = "no-store"
        return response

    # -- columns ------------------------------------------------------------------------------------------------

    @admin.display(description="key")
    def shown_prefix(self, obj: ApiToken) -> str:
        return f"{obj.prefix}…"

    @admin.display(description="scopes")
    def scope_list(self, obj: ApiToken) -> str:
        return ", ".join(obj.scopes)

    @admin.display(boolean=True, description="active")
    def active(self, obj: ApiToken) -> bool:
        return obj.revoked_at is None

    # -- actions ------------------------------------------------------------------------------------------------

    @admin.action(description="Revoke selected keys", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        if too_many(self, request, queryset, "revoke every key of a user with `manage.py revoke_api_token --user`."):
            return
        revoked = 0
        for token in queryset.filter(revoked_at__isnull=True):
            if tokens.revoke_token(token_id=token.pk):
                revoked += 1
                self.log_change(request, token, "Revoked")
        level = messages.SUCCESS if revoked else messages.WARNING
        self.message_user(
            request, f"Revoked {revoked} key(s); their open connections are closed (4008) at once.", level
        )
