from django.apps import AppConfig


class ChatConfig(AppConfig):
    """WebSocket gateway: consumer, protocol, agent runtime and backends."""

    name = "chat"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from sessions_app import signals

        from . import metrics  # registers the collectors

        signals.run_transitioned.connect(metrics.on_run_transition, dispatch_uid="agentgate-metrics-run-end")
