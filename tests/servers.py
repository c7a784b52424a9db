"""Real server processes for tests: spawn `manage.py serve`, kill it, talk to it over a socket.

Usage::

    env = prepare_database(tmp_path)                   # migrated SQLite file + fast timings
    token = create_token(env, "bob")
    server = start_server(env=env)                     # free port picked when none is given
    server.wait_ready()
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
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
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
        """Block until /healthz answers 200; raise with the server log if it never does."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1) as res:
                    if res.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"server not ready after {timeout}s:\n{self.output()}")

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

    def stop(self) -> None:
        """Best-effort clean-up: SIGTERM, then SIGKILL."""
        if self.alive():
            self.terminate()
            try:
                self.proc.wait(10)
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
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
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


class WsClient:
    """Speaks protocol v4 to a real server with the `websockets` package."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self.responses: dict[str, dict[str, Any]] = {}
        self.close_code: int | None = None
        self.hello: dict[str, Any] | None = None
        self._ids = itertools.count(1)

    async def _pump_one(self, timeout: float) -> dict[str, Any] | None:
        from websockets.exceptions import ConnectionClosed

        try:
            text = await asyncio.wait_for(self.ws.recv(), timeout)
        except ConnectionClosed as exc:
            self.close_code = exc.rcvd.code if exc.rcvd is not None else 1006
            return None
        frame: dict[str, Any] = json.loads(text)
        if frame["type"] == "event":
            self.events.append(frame)
        elif frame["type"] == "res":
            self.responses[frame["id"]] = frame
        return frame

    async def send(self, method: str, params: dict[str, Any] | None = None) -> str:
        rid = f"r{next(self._ids)}"
        frame: dict[str, Any] = {"type": "req", "id": rid, "method": method}
        if params is not None:
            frame["params"] = params
        await self.ws.send(json.dumps(frame))
        return rid

    async def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 5.0) -> dict[str, Any]:
        rid = await self.send(method, params)
        deadline = time.monotonic() + timeout
        while rid not in self.responses:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.close_code is not None:
                raise AssertionError(f"no response to {method}; close={self.close_code}")
            with contextlib.suppress(TimeoutError):
                await self._pump_one(remaining)
        return self.responses.pop(rid)

    async def ok(self, method: str, params: dict[str, Any] | None = None, timeout: float = 5.0) -> dict[str, Any]:
        res = await self.call(method, params, timeout)
        assert res["ok"], res
        payload: dict[str, Any] = res["payload"]
        return payload

    async def wait_event(self, pred: Callable[[dict[str, Any]], bool], timeout: float = 5.0) -> dict[str, Any]:
        """The first event (seen so far or arriving within `timeout`) matching `pred`."""
        deadline = time.monotonic() + timeout
        idx = 0
        while True:
            while idx < len(self.events):
                if pred(self.events[idx]):
                    return self.events[idx]
                idx += 1
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.close_code is not None:
                raise AssertionError(f"event not seen; close={self.close_code}; events={self.events[-5:]}")
            with contextlib.suppress(TimeoutError):
                await self._pump_one(remaining)

    async def wait_closed(self, timeout: float = 10.0) -> int:
        deadline = time.monotonic() + timeout
        while self.close_code is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError("socket not closed")
            with contextlib.suppress(TimeoutError):
                await self._pump_one(remaining)
        return self.close_code


@contextlib.asynccontextmanager
async def ws_client(server: ServerHandle, token: str, *, subscribe: bool = True) -> AsyncIterator[WsClient]:
    """Connect, complete the handshake and (by default) subscribe to sessions.changed."""
    import websockets

    async with websockets.connect(server.ws_url, open_timeout=5, max_size=2**21) as ws:
        client = WsClient(ws)
        challenge = await client._pump_one(5)
        assert challenge is not None and challenge.get("event") == "connect.challenge", challenge
        client.hello = await client.ok(
            "connect",
            {"minProtocol": 4, "maxProtocol": 4, "client": {"id": "t", "version": "1"}, "auth": {"token": token}},
        )
        if subscribe:
            await client.ok("sessions.subscribe", {})
        yield client
