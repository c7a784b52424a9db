"""HTTP routes of the chat app (the page, login/logout, health)."""

from django.urls import path

from . import ops_views, page_views

urlpatterns = [
    path("healthz", ops_views.healthz, name="healthz"),
    path("readyz", ops_views.readyz, name="readyz"),
    path("metrics", ops_views.metrics, name="metrics"),
    path("", page_views.index, name="index"),
    path("login/", page_views.LoginView.as_view(), name="login"),
    path("logout/", page_views.LogoutView.as_view(), name="logout"),
]
