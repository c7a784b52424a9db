"""Fixtures of the OpenClaw client suites: the pinned install, one server for the package, a user
per module.

Skipped, saying why, when npm cannot install the clients (no registry). A missing tool that CI
installs (tmux, Chromium, Playwright) fails instead under AGENTGATE_REQUIRE_SERVICES=1.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.openclaw import NODE_VERSION, OPENCLAW_VERSION, Gateway, InstallError, OpenClaw, install
from tests.support.servers import ServerHandle, create_token, free_port, prepare_database, start_server

REQUIRED = os.environ.get("AGENTGATE_REQUIRE_SERVICES") == "1"
# a second model, so /model has a choice to offer
AGENTS = {"main": {"backend": "scripted", "model": "scripted", "models": ["scripted", "scripted-alt"]}}


def need(ok: bool, reason: str) -> None:
    """Skip saying why; under AGENTGATE_REQUIRE_SERVICES=1 (CI installs these tools) fail instead."""
    if ok:
        return
    if REQUIRED:
        pytest.fail(f"{reason}; AGENTGATE_REQUIRE_SERVICES=1")
    pytest.skip(reason)


@pytest.fixture(autouse=True)
def _fresh_runtime() -> Iterator[None]:
    """Replaces the suite's async runtime reset: the gateway runs in a subprocess here, and
    Playwright's sync API holds an event loop in this thread."""
    yield


@pytest.fixture(scope="session")
def openclaw(request: pytest.FixtureRequest) -> OpenClaw:
    """Node 24 and openclaw, installed from npm into the pytest cache once (keyed by both versions)."""
    need(shutil.which("npm") is not None, "npm is needed to install OpenClaw's clients")
    name = f"openclaw-{OPENCLAW_VERSION}-node-{NODE_VERSION}"
    cache = getattr(request.config, "cache", None)  # absent under `-p no:cacheprovider`
    prefix = Path(cache.mkdir(name)) if cache is not None else Path(tempfile.gettempdir()) / f"agentgate-{name}"
    try:
        return install(prefix)
    except InstallError as exc:
        # as test_openclaw_node.py: the registry is outside what the suite controls
        pytest.skip(f"could not install openclaw@{OPENCLAW_VERSION} with node@{NODE_VERSION} from npm: {exc}")


@dataclass
class OpenClawServer:
    """The package's one `manage.py serve`, and the port its Control UI site will use."""

    server: ServerHandle
    env: dict[str, str]
    tmp: Path
    site_port: int

    @property
    def ws_url(self) -> str:
        # OpenClaw's clients connect to the root path
        return f"ws://127.0.0.1:{self.server.port}/"

    def user(self, name: str) -> Gateway:
        return Gateway(self.server, create_token(self.env, name))

    def log_tail(self, chars: int = 3000) -> str:
        return self.server.output()[-chars:]


@pytest.fixture(scope="package")
def oc_server(openclaw: OpenClaw, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenClawServer]:
    tmp = tmp_path_factory.mktemp("openclaw-gateway")
    site_port = free_port()
    env = prepare_database(
        tmp,
        GATEWAY_AGENTS=json.dumps(AGENTS),
        # the Control UI's own files are served from here (docs/protocol-notes.md, "OpenClaw's Control UI")
        GATEWAY_ALLOWED_ORIGINS=f"http://127.0.0.1:{site_port}",
        GATEWAY_DEMO_TOOLS="false",
    )
    server = start_server(env=env, log_dir=tmp)
    server.wait_ready()
    yield OpenClawServer(server, env, tmp, site_port)
    server.stop()
