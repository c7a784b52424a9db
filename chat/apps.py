from django.apps import AppConfig


class ChatConfig(AppConfig):
    """WebSocket gateway: consumer, protocol, agent runtime and backends."""

    name = "chat"
    default_auto_field = "django.db.models.BigAutoField"
