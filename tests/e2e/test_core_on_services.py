"""The core WebSocket suites again, on PostgreSQL with the channels-redis layer.

The same consumer, lifecycle and delivery tests run in a child pytest whose
settings point at PostgreSQL (DATABASE_URL) and Redis (REDIS_URL), so every
payload goes through msgpack and every transition through PostgreSQL's row locks.
Skipped, with the reason, when either service is not reachable.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.support import services

ROOT = Path(__file__).resolve().parents[2]
CORE_SUITES = [
    "tests/e2e/test_smoke.py",
    "tests/chat/test_handshake.py",
    "tests/chat/test_chat_send.py",
    "tests/chat/test_lifecycle_rules.py",
    "tests/chat/test_repair_lossy_layer.py",
    "tests/chat/test_fuzz_frames.py",
]

# The child run has its own per-test timeout; this one waits for all of it (a busy machine takes minutes).
pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(900)]


def test_core_suites_on_postgres_and_redis() -> None:
    if os.environ.get("AGENTGATE_CHILD_SUITE"):
        pytest.skip("already inside the service-backed child run")
    services.require_services()
    base = urlparse(services.POSTGRES_URL)
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(
        {
            # pytest-django creates (and drops) test_<name> next to this database name
            "DATABASE_URL": base._replace(path=f"/agentgate_core_{uuid.uuid4().hex[:8]}").geturl(),
            "REDIS_URL": services.REDIS_URL,
            "REDIS_LAYER_PREFIX": f"agtcore{uuid.uuid4().hex[:6]}",
            "AGENTGATE_CHILD_SUITE": "1",
        }
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "--timeout", "90", *CORE_SUITES],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-60:])
    assert proc.returncode == 0, f"core suites failed on PostgreSQL + Redis:\n{tail}"
    assert " passed" in proc.stdout and " failed" not in proc.stdout, tail
