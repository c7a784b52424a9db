"""A real gateway server process for browser tests and the screenshot script.

The server runs `manage.py serve` (daphne) on a free 127.0.0.1 port with a
temporary SQLite file and DEBUG off, so static files are checked the way
`make run` serves them without a proxy.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    # Two pages of one browser must both keep running timers and sockets at full speed.
    "--disable-background-timer-throttling",
    "--disable-renderer-backgrounding",
    "--disable-backgrounding-occluded-windows",
]
PASSWORD = "browser-pass-1234"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class GatewayServer:
    """Start, stop and restart one `manage.py serve` process on a fixed port and database."""

    def __init__(self, *, users: int = 0, extra_env: dict[str, str] | None = None) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="agentgate-browser-"))
        self.db_path = self.tmp / "db.sqlite3"
        self.log_path = self.tmp / "server.log"
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.users = [f"user{i}" for i in range(1, users + 1)]
        self.proc: subprocess.Popen[bytes] | None = None
        env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
        env.update(
            {
                "DJANGO_SETTINGS_MODULE": "gatewayproject.settings",
                "DATABASE_URL": f"sqlite:///{self.db_path}",
                "DEBUG": "False",
                "ALLOWED_HOSTS": "127.0.0.1,localhost",
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(extra_env or {})
        self.env = env

    def _manage(self, *args: str, timeout: float = 120) -> str:
        result = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
        return result.stdout

    def prepare(self) -> None:
        """Create the schema and the test users (user1..userN, password PASSWORD)."""
        self._manage("migrate", "--noinput")
        if self.users:
            names = ",".join(repr(u) for u in self.users)
            code = (
                "from django.contrib.auth import get_user_model\n"
                "U = get_user_model()\n"
                f"for name in [{names}]:\n"
                f"    U.objects.filter(username=name).exists() or U.objects.create_user(name, password={PASSWORD!r})\n"
            )
            self._manage("shell", "-c", code)

    def start(self, timeout: float = 30.0) -> None:
        """Start serving and wait until /healthz answers."""
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(f"{self.base_url}/healthz", timeout=1) as res,
            ):
                if res.status == 200:
                    return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server did not answer /healthz in {timeout}s:\n{self.log_tail()}")

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (the server drains runs, then exits); SIGKILL if it does not."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)
