"""What the gateway hangs on Django's and the domain's signals, wired once from `ChatConfig.ready`.

Imported only then (it imports the models, which Django loads after the app configs). Importing
it also registers the system checks, every method (`chat.methods`) and the state gauges.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_out
from django.db.models.signals import post_save, pre_save

import chat.methods  # noqa: F401  (each family registers its methods on import)
from chat import checks  # noqa: F401  (registers the system checks)
from chat.delivery import receivers
from chat.runtime import hooks
from chat.web import run_metrics, state_gauges  # noqa: F401  (the gauges register with Prometheus)
from chat.websocket import access
from sessions_app import signals


def connect() -> None:
    """Events from lifecycle signals, this process's runtime told of committed changes, run metrics,
    and revocation that open sockets feel at once (`chat.websocket.access`)."""
    receivers.use_hooks(hooks)
    signals.run_transitioned.connect(receivers.on_run_transitioned, dispatch_uid="chat-run-transitioned")
    signals.session_changed.connect(receivers.on_session_changed, dispatch_uid="chat-session-changed")
    signals.tool_changed.connect(receivers.on_tool_changed, dispatch_uid="chat-tool-changed")
    signals.command_stored.connect(receivers.on_command_stored, dispatch_uid="chat-command-stored")
    signals.run_transitioned.connect(run_metrics.on_run_transition, dispatch_uid="chat-metrics-run-end")
    signals.usage_recorded.connect(run_metrics.on_usage_recorded, dispatch_uid="chat-metrics-usage")

    user_model = get_user_model()
    user_logged_out.connect(access.on_logged_out, dispatch_uid="chat-access-logout")
    pre_save.connect(access.on_user_pre_save, sender=user_model, dispatch_uid="chat-access-user-before")
    post_save.connect(access.on_user_saved, sender=user_model, dispatch_uid="chat-access-user-saved")
    signals.tokens_revoked.connect(access.on_tokens_revoked, dispatch_uid="chat-access-tokens")
