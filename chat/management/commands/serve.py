"""Serve the gateway with daphne: frame limit from settings, the runtime at start-up,
graceful drain on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

import daphne.server  # installs the asyncio reactor; must come before twisted imports  # isort: skip
from daphne.endpoints import build_endpoint_description_strings
from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from twisted.internet import reactor

from chat.runtime.availability import Unavailable
from chat.runtime.gateway import runtime
from chat.web.serving import header_deadline
from chat.websocket.outbound import with_buffer_probe
from gatewayproject.asgi import application
from gatewayproject.logs import access_logger

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Serve HTTP and the gateway WebSocket with daphne."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--access-log",
            default=None,
            help="access log: a file path, or '-' for stdout (formatted like the other logs: "
            "LOG_FORMAT=json gives JSON lines)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        host, port = options["host"], options["port"]
        server = daphne.server.Server(
            # each WebSocket sees how much its transport holds unsent (maxBufferedBytes)
            application=with_buffer_probe(application),
            endpoints=build_endpoint_description_strings(host=host, port=port),
            websocket_max_message_size=settings.GATEWAY_MAX_PAYLOAD,
            signal_handlers=False,
            action_logger=access_logger(options["access_log"]) if options["access_log"] else None,
            root_path="",
            verbosity=1,
            # behind a TLS-terminating proxy the client is who the proxy says it is
            **(
                {
                    "proxy_forwarded_address_header": "X-Forwarded-For",
                    "proxy_forwarded_port_header": "X-Forwarded-Port",
                    "proxy_forwarded_proto_header": "X-Forwarded-Proto",
                }
                if settings.GATEWAY_BEHIND_PROXY
                else {}
            ),
        )

        pending: set[asyncio.Future[None]] = set()  # keep start-up and drain tasks referenced
        stopping = {"done": False}

        def keep(future: asyncio.Future[None]) -> None:
            pending.add(future)
            future.add_done_callback(pending.discard)

        async def start_when_possible() -> None:
            # A start that failed (the database or Redis away, or anything else) is tried again
            # until it works; /readyz says unready meanwhile. Logged once, not at every try.
            delay = 1.0
            failed = False
            while not stopping["done"]:
                try:
                    await runtime.ensure_started()
                    if failed:
                        log.info("the gateway runtime started after all")
                    return
                except Exception as exc:
                    if not failed and not isinstance(exc, Unavailable):  # (an outage is logged by availability)
                        log.exception("starting the gateway runtime failed; trying again until it starts")
                    failed = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

        def start_runtime() -> None:
            # autobahn drops the TCP connection on a protocol failure by default (the
            # client sees 1006); with failByDrop off it sends the close frame, so an
            # oversize frame gets the 1009 the protocol promises.
            server.ws_factory.setProtocolOptions(failByDrop=False)
            # slow headers (slowloris) are dropped instead of held open
            header_deadline(server.http_factory, settings.GATEWAY_HEADER_TIMEOUT_SECONDS, reactor)
            keep(asyncio.ensure_future(start_when_possible()))

        def on_signal(signum: int, frame: Any) -> None:
            if stopping["done"]:
                return
            stopping["done"] = True
            self.stdout.write(f"signal {signum}: draining runs, then stopping", ending="\n")
            reactor.callFromThread(begin_shutdown)

        def begin_shutdown() -> None:
            async def drain() -> None:
                try:
                    if runtime.running:
                        await runtime.drain_and_stop(settings.GATEWAY_SHUTDOWN_DRAIN_SECONDS)
                finally:
                    reactor.stop()  # type: ignore[misc]  # twisted stubs type the reactor loosely

            keep(asyncio.ensure_future(drain()))

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        reactor.callWhenRunning(start_runtime)  # type: ignore[attr-defined]
        self.stdout.write(f"agentgate listening on http://{host}:{port}/ (WebSocket ws://{host}:{port}/ws/gateway)")
        self.stdout.flush()
        server.run()
