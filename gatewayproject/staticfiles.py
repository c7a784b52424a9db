"""Static files served by the app itself, refusing paths that leave the static folders."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.exceptions import SuspiciousOperation
from django.core.handlers.exception import response_for_exception


class StaticFilesHandler(ASGIStaticFilesHandler):
    """Django's handler, but `/static/../../manage.py` is a 400, not a 500 with a traceback."""

    async def get_response_async(self, request: Any) -> Any:
        try:
            return await super().get_response_async(request)
        except SuspiciousOperation as exc:
            return await sync_to_async(response_for_exception, thread_sensitive=False)(request, exc)
