"""The MCP server pool against real servers: our test server (stdio, streamable HTTP), mcp-server-time, mcp-server-git.

No mocks and no database: each test gets a pool of its own and closes it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from chat.runtime.tools import results as tools_results
from chat.runtime.tools.pool import ServerPool
from chat.runtime.tools.results import ToolServerError
from tests.support.tools import TEST_SERVER

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(30)


def _alive(pid: int) -> bool:
    """Whether the process runs (a zombie waiting for its reaper counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


async def _eventually(check: Callable[[], bool], timeout: float, step: float = 0.05) -> float:
    """Wait until `check()` holds; return the seconds it took, or fail after `timeout`."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not true within {timeout} s")
        await asyncio.sleep(step)
    return time.monotonic() - start


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
async def pool() -> AsyncIterator[ServerPool]:
    p = ServerPool()
    yield p
    await p.aclose()


@pytest.fixture
def count_file(tmp_path: Path) -> Path:
    return tmp_path / "count.txt"


@pytest.fixture
def servers(count_file: Path) -> dict[str, dict[str, Any]]:
    return {"t": {"command": sys.executable, "args": [TEST_SERVER], "env": {"MCP_COUNT_FILE": str(count_file)}}}


async def _pid(pool: ServerPool, servers: dict[str, dict[str, Any]]) -> int:
    return int((await pool.call("a", servers, "t", "pid", {}, timeout_s=10)).text)


# --- stdio ---------------------------------------------------------------------------------------


async def test_tools_are_listed_with_read_only_from_annotations(
    pool: ServerPool, servers: dict[str, dict[str, Any]]
) -> None:
    tools = {spec.tool: spec for spec in await pool.list_tools("a", servers)}
    assert {"count", "echo", "slow", "stubborn", "big", "progress_flood", "fail", "crash"} <= tools.keys()
    assert tools["echo"].read_only is True
    assert tools["count"].read_only is False
    assert tools["echo"].qualified == "t.echo"
    assert tools["echo"].model_name == "t__echo"
    assert tools["echo"].description == "Return the text."
    assert tools["echo"].input_schema["properties"]["text"]["type"] == "string"


async def test_call_returns_text_and_surfaces_is_error(
    pool: ServerPool, servers: dict[str, dict[str, Any]], count_file: Path
) -> None:
    echoed = await pool.call("a", servers, "t", "echo", {"text": "hello"}, timeout_s=10)
    assert (echoed.text, echoed.is_error) == ("hello", False)

    failed = await pool.call("a", servers, "t", "fail", {"message": "no luck"}, timeout_s=10)
    assert failed.is_error is True
    assert "no luck" in failed.text

    assert (await pool.call("a", servers, "t", "count", {"arg": "x"}, timeout_s=10)).text == "1"
    assert (await pool.call("a", servers, "t", "count", {"arg": "y"}, timeout_s=10)).text == "2"
    assert _lines(count_file) == ["call x", "call y"]

    whole = await pool.call("a", servers, "t", "big", {"n": 1_000_000}, timeout_s=10)
    assert len(whole.text) == 1_000_000  # returned whole: capping is the caller's business


async def test_a_result_over_the_limit_is_refused(
    pool: ServerPool, servers: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert tools_results.MAX_RESULT_BYTES == 8 * 1024 * 1024
    monkeypatch.setattr(tools_results, "MAX_RESULT_BYTES", 100_000)  # 8 MiB through stdio takes seconds
    assert len((await pool.call("a", servers, "t", "big", {"n": 100_000}, timeout_s=10)).text) == 100_000
    with pytest.raises(ToolServerError, match="too much text"):
        await pool.call("a", servers, "t", "big", {"n": 100_001}, timeout_s=10)
    assert (await pool.call("a", servers, "t", "echo", {"text": "still here"}, timeout_s=10)).text == "still here"


async def test_timeout_raises_and_cancels_the_request_at_the_server(
    pool: ServerPool, servers: dict[str, dict[str, Any]], count_file: Path
) -> None:
    await pool.list_tools("a", servers)  # started: the timeout below measures the call only
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        await pool.call("a", servers, "t", "slow", {"ms": 10_000}, timeout_s=0.5)
    assert time.monotonic() - start < 1.0
    await _eventually(lambda: "cancelled" in _lines(count_file), timeout=1.5)


async def test_cancelling_the_caller_returns_at_once_and_cancels_at_the_server(
    pool: ServerPool, servers: dict[str, dict[str, Any]], count_file: Path
) -> None:
    pid = await _pid(pool, servers)
    task = asyncio.create_task(pool.call("a", servers, "t", "slow", {"ms": 10_000}, timeout_s=30))
    await asyncio.sleep(0.5)  # the request is at the server
    start = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - start < 0.25
    await _eventually(lambda: "cancelled" in _lines(count_file), timeout=1.5)
    # A server that honoured the cancellation is left alone.
    await asyncio.sleep(2.3)
    assert pool.kill_count() == 0
    assert await _pid(pool, servers) == pid


async def test_a_server_that_ignores_cancellation_is_killed_after_2_s_and_restarted(
    pool: ServerPool, servers: dict[str, dict[str, Any]]
) -> None:
    pid = await _pid(pool, servers)
    task = asyncio.create_task(pool.call("a", servers, "t", "stubborn", {"ms": 20_000}, timeout_s=30))
    await asyncio.sleep(0.5)
    start = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - start < 0.25  # the caller does not wait for the 2 s watch
    took = await _eventually(lambda: not _alive(pid), timeout=5.0)
    assert 1.5 < took < 4.5
    assert pool.kill_count() == 1
    assert (await pool.call("a", servers, "t", "echo", {"text": "back"}, timeout_s=10)).text == "back"
    assert await _pid(pool, servers) != pid


async def test_a_crash_fails_the_call_and_the_next_call_starts_the_server_again(
    pool: ServerPool, servers: dict[str, dict[str, Any]]
) -> None:
    pid = await _pid(pool, servers)
    with pytest.raises(ToolServerError, match="exited"):
        await pool.call("a", servers, "t", "crash", {}, timeout_s=10)
    assert (await pool.call("a", servers, "t", "echo", {"text": "again"}, timeout_s=10)).text == "again"
    assert await _pid(pool, servers) != pid
    assert pool.kill_count() == 0


async def test_a_progress_flood_reaches_on_progress_a_bounded_number_of_times(
    pool: ServerPool, servers: dict[str, dict[str, Any]]
) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    await pool.list_tools("a", servers)
    start = time.monotonic()
    outcome = await pool.call("a", servers, "t", "progress_flood", {"n": 1_000}, timeout_s=25, on_progress=on_progress)
    took = time.monotonic() - start
    assert outcome.text == "done"
    assert 1 <= len(seen) <= took * 10 + 2
    assert seen[0][1] == 1_000
    assert seen[0][2] is not None and seen[0][2].startswith("step ")


async def test_tools_list_changed_invalidates_the_cached_listing(
    pool: ServerPool, servers: dict[str, dict[str, Any]]
) -> None:
    before = {spec.tool for spec in await pool.list_tools("a", servers)}
    assert "extra" not in before
    await pool.call("a", servers, "t", "grow", {"name": "extra"}, timeout_s=10)

    async def listed() -> set[str]:
        return {spec.tool for spec in await pool.list_tools("a", servers)}

    start = time.monotonic()
    while "extra" not in await listed():
        assert time.monotonic() - start < 2.0, "the listing was not refreshed"
        await asyncio.sleep(0.05)


async def test_a_server_that_cannot_start_is_named(pool: ServerPool, servers: dict[str, dict[str, Any]]) -> None:
    servers["broken"] = {"command": "/nonexistent/mcp-server"}
    with pytest.raises(ToolServerError, match="'broken' could not start: command '/nonexistent/mcp-server' not found"):
        await pool.list_tools("a", servers)
    servers["broken"] = {"command": sys.executable, "args": ["-c", "import sys; sys.exit(3)"]}
    with pytest.raises(ToolServerError, match="'broken' could not start"):
        await pool.list_tools("a", servers)
    with pytest.raises(ToolServerError, match="'nope'"):
        await pool.call("a", servers, "nope", "echo", {}, timeout_s=5)


# --- streamable HTTP -----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    count_file = tmp_path_factory.mktemp("http") / "count.txt"
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, TEST_SERVER, "--http", str(port)],
        env={**os.environ, "MCP_COUNT_FILE": str(count_file)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert proc.poll() is None, "the HTTP test server exited"
                assert time.monotonic() < deadline, "the HTTP test server did not answer"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp", count_file
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_streamable_http_lists_calls_and_times_out(pool: ServerPool, http_server: tuple[str, Path]) -> None:
    url, count_file = http_server
    servers = {"h": {"url": url, "headers": {"X-Test": "1"}}}
    tools = {spec.tool: spec for spec in await pool.list_tools("a", servers)}
    assert tools["echo"].read_only is True and tools["count"].read_only is False
    assert (await pool.call("a", servers, "h", "echo", {"text": "over http"}, timeout_s=10)).text == "over http"
    assert (await pool.call("a", servers, "h", "fail", {}, timeout_s=10)).is_error is True

    cancelled = _lines(count_file).count("cancelled")
    with pytest.raises(TimeoutError):
        await pool.call("a", servers, "h", "slow", {"ms": 10_000}, timeout_s=0.5)
    await _eventually(lambda: _lines(count_file).count("cancelled") > cancelled, timeout=1.5)


async def test_streamable_http_caller_cancellation_reaches_the_server(
    pool: ServerPool, http_server: tuple[str, Path]
) -> None:
    url, count_file = http_server
    servers = {"h": {"url": url}}
    await pool.list_tools("a", servers)
    cancelled = _lines(count_file).count("cancelled")
    task = asyncio.create_task(pool.call("a", servers, "h", "slow", {"ms": 10_000}, timeout_s=30))
    await asyncio.sleep(0.5)
    start = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - start < 0.25
    await _eventually(lambda: _lines(count_file).count("cancelled") > cancelled, timeout=1.5)
    assert pool.kill_count() == 0  # never for HTTP servers


# --- published servers ---------------------------------------------------------------------------


async def test_mcp_server_time(pool: ServerPool) -> None:
    servers = {"time": {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}}
    tools = {spec.tool: spec for spec in await pool.list_tools("a", servers)}
    assert tools["get_current_time"].read_only is True
    outcome = await pool.call("a", servers, "time", "get_current_time", {"timezone": "Europe/Paris"}, timeout_s=10)
    assert outcome.is_error is False
    assert "Europe/Paris" in outcome.text


async def test_mcp_server_git_commit_runs_once(pool: ServerPool, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    identity = {
        "GIT_AUTHOR_NAME": "Agent",
        "GIT_AUTHOR_EMAIL": "agent@example.invalid",
        "GIT_COMMITTER_NAME": "Agent",
        "GIT_COMMITTER_EMAIL": "agent@example.invalid",
    }

    def git(*args: str) -> str:
        env = {**os.environ, **identity}
        return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    git("config", "user.name", "Agent")
    git("config", "user.email", "agent@example.invalid")
    (repo / "a.txt").write_text("a\n")
    servers = {
        "git": {"command": sys.executable, "args": ["-m", "mcp_server_git", "--repository", str(repo)], "env": identity}
    }
    tools = {spec.tool: spec for spec in await pool.list_tools("a", servers)}
    assert tools["git_commit"].read_only is False and tools["git_status"].read_only is True
    added = await pool.call("a", servers, "git", "git_add", {"repo_path": str(repo), "files": ["a.txt"]}, timeout_s=10)
    assert added.is_error is False, added.text
    committed = await pool.call(
        "a", servers, "git", "git_commit", {"repo_path": str(repo), "message": "one"}, timeout_s=10
    )
    assert committed.is_error is False, committed.text
    assert git("rev-list", "--count", "HEAD").strip() == "1"


# --- the leash -----------------------------------------------------------------------------------

PARENT = textwrap.dedent(
    """
    import asyncio, sys
    from chat.runtime.tools.pool import ServerPool

    async def main() -> None:
        servers = {"t": {"command": sys.executable, "args": [sys.argv[1]]}}
        outcome = await ServerPool().call("a", servers, "t", "pid", {}, timeout_s=20)
        print(outcome.text, flush=True)
        await asyncio.sleep(60)

    asyncio.run(main())
    """
)


async def test_a_stdio_server_dies_with_a_gateway_killed_by_sigkill(tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = await asyncio.create_subprocess_exec(
        sys.executable, str(script), TEST_SERVER, stdout=asyncio.subprocess.PIPE, cwd=ROOT
    )
    try:
        assert parent.stdout is not None
        child = int(await asyncio.wait_for(parent.stdout.readline(), timeout=20))
        assert _alive(child)
        parent.kill()  # SIGKILL: the gateway gets no chance to close anything
        await asyncio.wait_for(parent.wait(), timeout=5)
        await _eventually(lambda: not _alive(child), timeout=3.0)
    finally:
        if parent.returncode is None:
            parent.kill()
            await parent.wait()
