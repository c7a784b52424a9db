"""HTTP routes of the chat app (the page, login/logout, health)."""

from django.urls import path

from . import views

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
]
