from django.apps import AppConfig


class SessionsAppConfig(AppConfig):
    """Chat sessions, runs, transcripts and the lifecycle service."""

    name = "sessions_app"
    label = "sessions_app"  # never "sessions": that is django.contrib.sessions
    verbose_name = "Chat sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at module top: the receivers import models, loaded after app configs.
        from sessions_app import (
            audit_trail,  # noqa: F401  (connects the audit receivers)
            files,  # noqa: F401  (connects the stored files' receivers)
        )
