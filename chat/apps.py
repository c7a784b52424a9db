from django.apps import AppConfig


class ChatConfig(AppConfig):
    """WebSocket gateway: consumer, protocol, agent runtime and backends."""

    name = "chat"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at module top: they import models, which Django loads after app configs.
        from django.contrib.auth import get_user_model
        from django.contrib.auth.signals import user_logged_out
        from django.db.models.signals import post_save, pre_save

        # On import: the state gauges register with Prometheus, the `agent` method with the methods, the checks.
        from chat import checks  # noqa: F401
        from chat.delivery import receivers
        from chat.methods import agent, openclaw, tools  # noqa: F401
        from chat.web import run_metrics, state_gauges  # noqa: F401
        from chat.websocket import access
        from sessions_app import signals

        signals.run_transitioned.connect(receivers.on_run_transitioned, dispatch_uid="chat-run-transitioned")
        signals.session_changed.connect(receivers.on_session_changed, dispatch_uid="chat-session-changed")
        signals.tool_changed.connect(receivers.on_tool_changed, dispatch_uid="chat-tool-changed")
        signals.run_transitioned.connect(run_metrics.on_run_transition, dispatch_uid="chat-metrics-run-end")

        # revocation that open sockets feel at once (chat.websocket.access)
        user_model = get_user_model()
        user_logged_out.connect(access.on_logged_out, dispatch_uid="chat-access-logout")
        pre_save.connect(access.on_user_pre_save, sender=user_model, dispatch_uid="chat-access-user-before")
        post_save.connect(access.on_user_saved, sender=user_model, dispatch_uid="chat-access-user-saved")
        signals.tokens_revoked.connect(access.on_tokens_revoked, dispatch_uid="chat-access-tokens")
