"""Browser pages: sign-in and sign-out (Django's auth views, styled) and the chat page."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache

from sessions_app import usage_reads

WARN_AT = 0.8  # the page warns of a budget used this far (docs/usage.md)


class LoginView(auth_views.LoginView):
    """The styled sign-in form; a signed-in user goes straight to the chat page."""

    template_name = "registration/login.html"
    redirect_authenticated_user = True


class LogoutView(auth_views.LogoutView):
    """Sign out (POST only, as Django requires); then back to the sign-in form."""


@never_cache
@login_required
def index(request: HttpRequest) -> HttpResponse:
    """The chat page: a static shell; everything else speaks the gateway protocol over one WebSocket."""
    context = {"ws_path": "/ws/gateway", "version": settings.GATEWAY_VERSION, "budgets": _budgets(request)}
    response = render(request, "chat/index.html", context)
    # the page's own WebSocket, by the host it was served from (not every browser reads 'self' as ws/wss)
    host = request.get_host()
    response._csp_update = {"connect-src": [f"ws://{host}", f"wss://{host}"]}  # type: ignore[attr-defined]
    return response


def _budgets(request: HttpRequest) -> list[dict[str, object]]:
    """The signed-in user's budgets as the page shows them (as of the page's load): what is used and
    left, when it resets, and a warning from WARN_AT of its limit."""
    shown: list[dict[str, object]] = []
    if request.user.pk is None:
        return shown
    for state in usage_reads.budget_states(request.user.pk):
        data = state.as_json()
        data["warn"] = state.used_fraction >= WARN_AT
        shown.append(data)
    return shown
