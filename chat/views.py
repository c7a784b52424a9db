"""HTTP views."""

from django.http import HttpRequest, JsonResponse


def healthz(request: HttpRequest) -> JsonResponse:
    """Process alive."""
    return JsonResponse({"ok": True})
