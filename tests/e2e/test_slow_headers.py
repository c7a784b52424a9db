"""Issue 11, Low: a client that sends its headers slowly is dropped at the header deadline."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from tests.support.servers import prepare_database, start_server

pytestmark = pytest.mark.server


def test_slow_headers_are_dropped(tmp_path: Path) -> None:
    env = prepare_database(tmp_path, GATEWAY_HEADER_TIMEOUT_SECONDS="2")
    server = start_server(env=env, log_dir=tmp_path)
    try:
        server.wait_ready()
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            closed = False
            for i in range(10):
                time.sleep(0.7)
                try:
                    sock.sendall(f"X-Slow-{i}: y\r\n".encode())
                    sock.settimeout(0.01)
                    if sock.recv(1) == b"":
                        closed = True
                        break
                except TimeoutError:
                    continue
                except OSError:
                    closed = True
                    break
            assert closed, "the slow client was not dropped"
        assert time.monotonic() - started < 5
        # a normal request is unaffected
        assert server.get("/healthz")[0] == 200
    finally:
        server.stop()
