from django.apps import AppConfig


class ChatConfig(AppConfig):
    """The gateway: the WebSocket and HTTP doors, methods, delivery, the runtime and its backends."""

    name = "chat"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at module top: it imports models, which Django loads after app configs.
        from chat import wiring

        wiring.connect()
