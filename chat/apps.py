from django.apps import AppConfig


class ChatConfig(AppConfig):
    """WebSocket gateway: consumer, protocol, agent runtime and backends."""

    name = "chat"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at module top: they import models, which Django loads after app configs.
        from sessions_app import signals

        # On import, metrics registers its collectors and agent_method the `agent` method.
        from . import agent_method, metrics, receivers  # noqa: F401

        signals.run_transitioned.connect(receivers.on_run_transitioned, dispatch_uid="chat-run-transitioned")
        signals.session_changed.connect(receivers.on_session_changed, dispatch_uid="chat-session-changed")
        signals.run_transitioned.connect(metrics.on_run_transition, dispatch_uid="chat-metrics-run-end")
