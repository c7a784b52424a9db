"""Real server processes for tests: spawn `manage.py serve`, kill it, talk to it over a socket.

Usage::

    env = prepare_database(tmp_path)                   # migrated SQLite file + fast timings
    token = create_token(env, "bob")
    server = start_server(env=env)                     # free port picked when none is given
    server.wait_ready()                                # /readyz answers 200
    async with ws_client(server, token) as client:
        await client.ok("chat.send", {...})
    server.kill()                                      # SIGKILL; .terminate() sends SIGTERM

Every handle is also registered for clean-up at interpreter exit, so a failing
test never leaves a server behind.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from tests.support.client import ProtocolClient

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable

# Fast timings: heartbeat twice a second, a dead process is noticed within seconds.
FAST_ENV = {
    "GATEWAY_HEARTBEAT_SECONDS": "0.5",
    "GATEWAY_RECOVERY_SECONDS": "3",
    "GATEWAY_REPAIR_SECONDS": "1",
    "GATEWAY_SHUTDOWN_DRAIN_SECONDS": "1",
}

_live: list[ServerHandle] = []


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_env(db_path: Path, **extra: str) -> dict[str, str]:
    """Environment for a server or command using the SQLite file `db_path`."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(FAST_ENV)
    env.update({"DATABASE_URL": f"sqlite:///{db_path}", "PYTHONUNBUFFERED": "1", "REDIS_URL": ""})
    env.update(extra)
    return env


def manage(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run `manage.py ARGS` with `env`; raise with its output when it fails."""
    proc = subprocess.run(
        [PYTHON, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def prepare_database(directory: Path, **extra: str) -> dict[str, str]:
    """Migrate a fresh SQLite database in `directory`; return the env that points at it."""
    env = base_env(directory / "gateway.sqlite3", **extra)
    manage(env, "migrate", "--noinput", "-v0")
    return env


def create_token(env: dict[str, str], username: str) -> str:
    """Create USER (if missing) and a token for it; the raw token is the last output line."""
    out = manage(env, "create_api_token", username, "--create-user").stdout
    return out.strip().splitlines()[-1]


class ServerHandle:
    """One `manage.py serve` subprocess."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, env: dict[str, str], log_path: Path) -> None:
        self.proc = proc
        self.port = port
        self.env = env
        self.log_path = log_path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws/gateway"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Block until /readyz answers 200, as a load balancer or readiness probe waits; raise
        with its last answer and the server log if it never does."""
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                status, body = self.get("/readyz", timeout=3)
                if status == 200:
                    return
                last = f"{status} {body}"
            except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
                last = repr(exc)
            time.sleep(0.05)
        raise RuntimeError(f"server not ready after {timeout}s (/readyz: {last}):\n{self.output()}")

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        """GET `path`; return (status, body) for any HTTP status."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as res:
                return res.status, res.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to clean up (a crash)."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self) -> None:
        """SIGTERM: a planned stop; the server drains. Use wait() for the exit."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float = 15.0) -> int:
        return self.proc.wait(timeout)

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        """Best-effort clean-up: SIGTERM (the server drains), then SIGKILL."""
        if self.alive():
            self.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()


def start_server(*, env: dict[str, str], port: int | None = None, log_dir: Path | None = None) -> ServerHandle:
    """Spawn `manage.py serve` on 127.0.0.1:`port` (a free one by default)."""
    port = port or free_port()
    log_dir = log_dir or Path(env["DATABASE_URL"].removeprefix("sqlite:///")).parent
    log_path = log_dir / f"server-{port}-{time.monotonic_ns()}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [PYTHON, "manage.py", "serve", "--host", "127.0.0.1", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    handle = ServerHandle(proc, port, env, log_path)
    _live.append(handle)
    return handle


@atexit.register
def _stop_all() -> None:
    for handle in _live:
        with contextlib.suppress(Exception):
            handle.stop()


# --- a protocol v4 client over a real socket --------------------------------------------------------


class WsClient(ProtocolClient):
    """The protocol client over a real socket, with the `websockets` package."""

    def __init__(self, ws: Any) -> None:
        super().__init__()
        self.ws = ws

    async def _receive(self, timeout: float) -> str | None:
        from websockets.exceptions import ConnectionClosed

        try:
            text: str = await asyncio.wait_for(self.ws.recv(), timeout)
        except ConnectionClosed as exc:
            self.closed = exc.rcvd.code if exc.rcvd is not None else 1006
            return None
        return text

    async def send_raw(self, text: str) -> None:
        await self.ws.send(text)


@contextlib.asynccontextmanager
async def ws_client(
    server: ServerHandle, token: str, *, subscribe: bool = True, params: dict[str, Any] | None = None
) -> AsyncIterator[WsClient]:
    """Connect, complete the handshake and (by default) subscribe to sessions.changed."""
    import websockets

    async with websockets.connect(server.ws_url, open_timeout=5, max_size=2**21) as ws:
        client = WsClient(ws)
        challenge = await client._pump_one(5)
        assert challenge is not None and challenge.get("event") == "connect.challenge", challenge
        client.hello = await client.ok(
            "connect",
            {
                "minProtocol": 4,
                "maxProtocol": 4,
                "client": {"id": "t", "version": "1"},
                "auth": {"token": token},
                **(params or {}),
            },
        )
        if subscribe:
            await client.ok("sessions.subscribe", {})
        yield client
