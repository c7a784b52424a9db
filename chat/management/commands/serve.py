"""Serve the gateway with daphne: frame limit from settings, the runtime at start-up,
graceful drain on SIGTERM/SIGINT.

A stop takes GATEWAY_SHUTDOWN_DRAIN_SECONDS and at most STOP_GRACE_SECONDS more, whatever the
load: what has not finished by then is left (the other processes' recovery sweep ends its runs),
and the process exits without waiting for a database call still under way, nor for Python's
teardown. Should anything hold the exit even so (a connection's handler that never ends), the
process ends itself EXIT_WAIT_SECONDS and KILL_AFTER_SECONDS later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import daphne.server  # installs the asyncio reactor; must come before twisted imports  # isort: skip
from daphne.endpoints import build_endpoint_description_strings
from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from twisted.internet import reactor

from chat.base import db
from chat.base.availability import Unavailable
from chat.runtime.gateway import runtime
from chat.web.serving import body_guard, header_deadline
from chat.websocket.outbound import plain_frame_logging, with_buffer_probe
from gatewayproject.asgi import application
from gatewayproject.logs import access_logger

log = logging.getLogger(__name__)
STOP_GRACE_SECONDS = 2.0  # after the drain: its runs ended, the runtime stopped, the connections closed
EXIT_WAIT_SECONDS = 0.5  # for database calls under way when the server has stopped
KILL_AFTER_SECONDS = 0.5  # then nothing is waited for (a connection's handler that never ends, say)
CLOSE_MARGIN_SECONDS = 0.5  # before the deadline: a drain still going closes the connections (4001) then


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
        server = _server(host, port, options["access_log"])
        control = _Control(server, self.stdout.write)
        signal.signal(signal.SIGTERM, control.on_signal)
        signal.signal(signal.SIGINT, control.on_signal)
        reactor.callWhenRunning(control.start_runtime)  # type: ignore[attr-defined]
        self.stdout.write(f"agentgate listening on http://{host}:{port}/ (WebSocket ws://{host}:{port}/ws/gateway)")
        self.stdout.flush()
        server.run()
        _exit_now()


def _server(host: str, port: int, access_log: str | None) -> daphne.server.Server:
    plain_frame_logging()
    return daphne.server.Server(
        # each WebSocket sees how much its transport holds unsent (maxBufferedBytes)
        application=with_buffer_probe(application),
        endpoints=build_endpoint_description_strings(host=host, port=port),
        websocket_max_message_size=settings.GATEWAY_MAX_PAYLOAD,
        signal_handlers=False,
        action_logger=access_logger(access_log) if access_log else None,
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


class _Control:
    """The runtime's start once the reactor runs (tried again until it starts), and the stop on a signal."""

    def __init__(self, server: daphne.server.Server, say: Callable[..., Any]) -> None:
        self.server = server
        self.say = say
        self.pending: set[asyncio.Future[None]] = set()  # keep start-up and drain tasks referenced
        self.stopping = False

    def keep(self, future: asyncio.Future[None]) -> None:
        self.pending.add(future)
        future.add_done_callback(self.pending.discard)

    def start_runtime(self) -> None:
        # autobahn drops the TCP connection on a protocol failure by default (the client sees
        # 1006); with failByDrop off it sends the close frame, so an oversize frame gets the
        # 1009 the protocol promises.
        self.server.ws_factory.setProtocolOptions(failByDrop=False)
        # slow headers (slowloris) are dropped instead of held open
        header_deadline(self.server.http_factory, settings.GATEWAY_HEADER_TIMEOUT_SECONDS, reactor)
        # HTTP API bodies: bounded in size and time before daphne has buffered them whole
        body_guard(
            self.server.http_factory,
            settings.GATEWAY_HTTP_MAX_BODY,
            settings.GATEWAY_HTTP_BODY_TIMEOUT_SECONDS,
            reactor,
        )
        self.keep(asyncio.ensure_future(self._start_when_possible()))

    async def _start_when_possible(self) -> None:
        # A start that failed (the database or Redis away, or anything else) is tried again
        # until it works; /readyz says unready meanwhile. Logged once, not at every try.
        delay = 1.0
        failed = False
        while not self.stopping:
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

    def on_signal(self, signum: int, frame: Any) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.say(f"signal {signum}: draining runs, then stopping", ending="\n")
        # Counted from the signal: a loaded event loop may take a while to begin the drain.
        deadline = time.monotonic() + settings.GATEWAY_SHUTDOWN_DRAIN_SECONDS + STOP_GRACE_SECONDS
        last_resort = threading.Timer(deadline + EXIT_WAIT_SECONDS + KILL_AFTER_SECONDS - time.monotonic(), _kill)
        last_resort.daemon = True
        last_resort.start()
        reactor.callFromThread(self._begin_shutdown, deadline)

    def _begin_shutdown(self, deadline: float) -> None:
        self.keep(asyncio.ensure_future(self._drain(deadline)))

    async def _drain(self, deadline: float) -> None:
        try:
            if runtime.running:
                draining = asyncio.ensure_future(runtime.drain_and_stop(settings.GATEWAY_SHUTDOWN_DRAIN_SECONDS))
                self.keep(draining)
                # Not cancelled and waited for (as `wait_for` would): a task may swallow its
                # cancellation (a Redis send turns it into a timeout), and the broadcaster's then
                # sent on through its whole queue, for over a minute after 200 streams.
                if not (await asyncio.wait({draining}, timeout=deadline - CLOSE_MARGIN_SECONDS - time.monotonic()))[0]:
                    # Running late (a loaded process): the clients are told now, while there is time
                    # for the close frames to leave before the reactor stops.
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(runtime.supervisor.close_connections(), CLOSE_MARGIN_SECONDS / 2)
                if not (await asyncio.wait({draining}, timeout=deadline - time.monotonic()))[0]:
                    # Cut short: events still queued for other processes' clients (repair brings
                    # them), leaving this process's layer groups (they expire).
                    log.info("stopping: %.1f s after the drain, exiting with the rest undone", STOP_GRACE_SECONDS)
        finally:
            reactor.stop()  # type: ignore[misc]  # twisted stubs type the reactor loosely


def _kill() -> None:
    os.write(2, b"the server did not exit in time after the signal: exiting now\n")
    os._exit(1)


def _exit_now() -> None:
    """Python's exit would wait for every database thread, however long its call (a statement), then
    free every object one by one (1.5 s for a loaded process on a busy machine): neither matters once
    the server has stopped, its pool is closed and its logs are flushed."""
    if not db.shutdown(EXIT_WAIT_SECONDS):
        log.warning("exiting without waiting for a database call still under way")
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
