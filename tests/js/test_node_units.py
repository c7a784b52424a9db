"""Run the chat page's JavaScript unit tests (Node's built-in test runner) as part of pytest."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def test_node_unit_tests_pass() -> None:
    """`node --test tests/js/` exits 0: the pure state module and the client behave."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (apt-get install nodejs); the JS unit tests cannot run")
    files = sorted(str(p.relative_to(ROOT)) for p in HERE.glob("*.test.mjs"))
    assert files, "no JS test files found"
    result = subprocess.run(
        [node, "--test", *files], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    summary = "\n".join(line for line in result.stdout.splitlines() if line.startswith("# "))
    assert result.returncode == 0, f"node --test failed:\n{result.stdout[-6000:]}\n{result.stderr[-2000:]}"
    assert "# fail 0" in summary, summary
