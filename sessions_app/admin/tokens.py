"""API tokens: state filter, revocation."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse

from sessions_app.models import (
    ApiToken,
)
from sessions_app.tokens import issue_token, revoke_token


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


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("prefix", "user", "name", "created_at", "last_used_at", "revoked_at", "is_active")
    list_filter = (TokenStateFilter,)
    list_select_related = ("user",)
    search_fields = ("prefix", "name", "user__username")
    autocomplete_fields = ("user",)
    actions = ("revoke",)
    ordering = ("-created_at",)

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "user" and not request.user.is_superuser:
            # A token acts as its user: only superusers may mint one for someone else.
            kwargs["queryset"] = get_user_model().objects.filter(pk=request.user.pk or 0)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_fields(self, request: HttpRequest, obj: ApiToken | None = None) -> Any:
        if obj is None:
            return ("user", "name")
        return ("user", "name", "prefix", "created_at", "last_used_at", "revoked_at")

    def get_readonly_fields(self, request: HttpRequest, obj: ApiToken | None = None) -> Any:
        if obj is None:
            return ()
        return ("user", "prefix", "created_at", "last_used_at", "revoked_at")

    @admin.display(boolean=True, description="active")
    def is_active(self, obj: ApiToken) -> bool:
        return obj.revoked_at is None

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        if change:
            obj.save(update_fields=["name"])
            return
        if not request.user.is_superuser and obj.user_id != request.user.pk:
            raise PermissionDenied("only superusers may create tokens for other users")
        token, raw = issue_token(obj.user, name=obj.name)
        obj.pk, obj.prefix, obj.token_hash, obj.created_at = token.pk, token.prefix, token.token_hash, token.created_at
        obj._state.adding = False
        obj._state.db = token._state.db
        obj._raw_token = raw  # type: ignore[attr-defined]  # shown once by response_add

    def response_add(self, request: HttpRequest, obj: ApiToken, post_url_continue: str | None = None) -> HttpResponse:
        """Show the raw token on its own page, once; it is never stored or put in a message."""
        context = {
            **self.admin_site.each_context(request),
            "title": "API token created",
            "opts": self.model._meta,
            "token": obj,
            "raw_token": getattr(obj, "_raw_token", ""),
            "changelist_url": reverse("admin:sessions_app_apitoken_changelist"),
        }
        response = TemplateResponse(request, "admin/sessions_app/apitoken/token_created.html", context)
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(description="Revoke selected tokens", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        revoked = 0
        for token in queryset.filter(revoked_at__isnull=True):
            if revoke_token(token_id=token.pk):
                revoked += 1
                self.log_change(request, token, "Revoked")
        self.message_user(request, f"Revoked {revoked} token(s).", messages.SUCCESS if revoked else messages.WARNING)
