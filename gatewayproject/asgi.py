"""ASGI entry point: HTTP (the /v1/ API, Django, static files) and the gateway WebSocket."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gatewayproject.settings")
django_asgi_app = get_asgi_application()  # must run before importing consumers

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from chat.httpapi.app import HttpApi  # noqa: E402
from chat.routing import websocket_urlpatterns  # noqa: E402
from chat.websocket.origin import OriginValidator  # noqa: E402
from gatewayproject.staticfiles import StaticFilesHandler  # noqa: E402

application = ProtocolTypeRouter(
    {
        # Static files are served by the app itself, in DEBUG and non-DEBUG runs alike,
        # so `make run` needs no proxy and the page works offline.
        # The OpenAI-compatible API (/v1/) is served before Django sees the request.
        "http": HttpApi(StaticFilesHandler(django_asgi_app)),
        "websocket": OriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))  # type: ignore[arg-type]
        ),
    }
)
