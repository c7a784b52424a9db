"""A real gateway server process for browser tests and the screenshot script.

The server runs `manage.py serve` (daphne) on a free 127.0.0.1 port with a
temporary SQLite file and DEBUG off, so static files are checked the way
`make run` serves them without a proxy.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.servers import ServerHandle, free_port, manage, start_server

ROOT = Path(__file__).resolve().parents[3]
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


@contextmanager
def launched_chromium() -> Iterator[Any]:
    """Debian's Chromium under Playwright's sync API, closed (and Playwright stopped) afterwards."""
    from playwright.sync_api import sync_playwright  # only the browser tests need the package

    pw = sync_playwright().start()
    browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    try:
        yield browser
    finally:
        browser.close()
        pw.stop()


class GatewayServer:
    """Start, stop and restart one `manage.py serve` process on a fixed port and database."""

    def __init__(self, *, users: int = 0, extra_env: dict[str, str] | None = None) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="agentgate-browser-"))
        self.db_path = self.tmp / "db.sqlite3"
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.users = [f"user{i}" for i in range(1, users + 1)]
        self.handle: ServerHandle | None = None
        env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
        env.update(
            {
                "DJANGO_SETTINGS_MODULE": "gatewayproject.settings",
                "DATABASE_URL": f"sqlite:///{self.db_path}",
                "DEBUG": "False",
                "ALLOWED_HOSTS": "127.0.0.1,localhost",
                "PYTHONUNBUFFERED": "1",
                # uploads (docs/files.md) in this server's own folder, never the project's
                "GATEWAY_FILES_STORAGE_OPTIONS": json.dumps({"location": str(self.tmp / "uploads")}),
            }
        )
        env.update(extra_env or {})
        self.env = env

    def _manage(self, *args: str, timeout: float = 120) -> str:
        return manage(self.env, *args, timeout=timeout).stdout

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
        """Start serving and wait until /readyz answers 200."""
        self.handle = start_server(env=self.env, port=self.port, log_dir=self.tmp)
        try:
            self.handle.wait_ready(timeout)
        except RuntimeError:
            self.stop()
            raise

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (the server drains runs, then exits); SIGKILL if it does not."""
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.stop(timeout)

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.handle.output().splitlines()[-lines:]) if self.handle else ""

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)
