"""WebSocket URL routes: /ws/gateway and, for OpenClaw clients, the root path."""

from django.urls import path

from chat.websocket.consumer import GatewayConsumer

websocket_urlpatterns = [
    path("ws/gateway", GatewayConsumer.as_asgi()),  # type: ignore[arg-type]
    path("", GatewayConsumer.as_asgi()),  # type: ignore[arg-type]
]
