"""HTTP routes of the chat app (the page, the API keys page, login/logout, health)."""

from django.urls import path

from chat.web import files, keys, ops, pages

urlpatterns = [
    path("healthz", ops.healthz, name="healthz"),
    path("readyz", ops.readyz, name="readyz"),
    path("metrics", ops.metrics, name="metrics"),
    path("", pages.index, name="index"),
    path("login/", pages.LoginView.as_view(), name="login"),
    path("logout/", pages.LogoutView.as_view(), name="logout"),
    path("api/keys", keys.index, name="api_keys"),
    path("api/keys/<int:key_id>/revoke", keys.revoke, name="api_key_revoke"),
    path("api/files", files.upload, name="files_upload"),
    path("api/files/<str:file_id>", files.read, name="files_read"),
]
