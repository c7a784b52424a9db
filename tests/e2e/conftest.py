"""Fixtures of the real-process suites."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.services import RedisProcess


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    r = RedisProcess(tmp_path)
    try:
        r.start()
        yield r
    finally:
        r.destroy()
