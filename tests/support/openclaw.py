"""OpenClaw's own clients (npm `openclaw`, pinned) against a real gateway: install, run, observe.

The package needs Node >= 24.16, newer than the machine's Node, so a pinned Node 24 is installed
from npm too (the `node` package ships the binary). Both go into the pytest cache, keyed by their
versions, and are reused by later runs. Each client runs with a private HOME and state folder and
with OpenClaw's update check and telemetry off, so nothing is read from or written to the user's
configuration and nothing leaves the machine.

- `install(prefix)`: Node 24 and OpenClaw under `prefix`, unless they are already there.
- `Tui`: `openclaw tui` in a private tmux server (send-keys, capture-pane).
- `AcpBridge`: `openclaw acp`, the Agent Client Protocol bridge, over its stdio JSON-RPC.
- `StaticSite`: the package's Control UI files on a loopback HTTP server.
- `Gateway`: sessions.list and friends over a real socket, to check what the server did.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import functools
import http.server
import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.support.servers import ServerHandle, ws_client

OPENCLAW_VERSION = "2026.9.6"
NODE_VERSION = "24.21.0"  # openclaw@2026.9.6 needs Node >= 24.16 (its preinstall refuses older ones)
INSTALL_TIMEOUT = 130  # each npm install; both stay within the first test's timeout

T = TypeVar("T")


class InstallError(RuntimeError):
    """The registry could not be reached or the install did not produce what it should."""


@dataclass(frozen=True)
class OpenClaw:
    """An installed OpenClaw and the Node that runs it."""

    node: Path
    package: Path

    @property
    def node_bin(self) -> Path:
        return self.node.parent

    @property
    def control_ui(self) -> Path:
        return self.package / "dist" / "control-ui"

    def command(self, *args: str) -> list[str]:
        return [str(self.node), str(self.package / "openclaw.mjs"), *args]


def _node_version(node: Path) -> str | None:
    try:
        out = subprocess.run([str(node), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _package_version(package: Path) -> str | None:
    try:
        return str(json.loads((package / "package.json").read_text())["version"])
    except (OSError, ValueError, KeyError):
        return None


def npm_install(
    npm: str, prefix: Path, spec: str, env: dict[str, str], *flags: str, timeout: float = INSTALL_TIMEOUT
) -> None:
    """`npm install SPEC` into its own folder (no lock file, no audit); InstallError if it fails."""
    prefix.mkdir(parents=True, exist_ok=True)
    (prefix / "package.json").write_text(json.dumps({"name": "agentgate-openclaw-tests", "private": True}))
    try:
        proc = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--no-package-lock", *flags, "--prefix", str(prefix), spec],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired as exc:
        raise InstallError(f"npm install {spec} took longer than {timeout}s") from exc
    if proc.returncode != 0:
        raise InstallError(f"npm install {spec} failed ({proc.returncode}): {proc.stderr[-800:]}")


def pinned_node_modules(request: Any, package: str, version: str) -> Path:
    """`package@version`'s node_modules, installed into the pytest cache when missing (a test that needs
    it skips with the reason when node, npm or the registry are not there)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip(f"node and npm are needed to run {package}")
    cache = getattr(request.config, "cache", None)  # absent under `-p no:cacheprovider`
    if cache is not None:
        prefix = Path(cache.mkdir(f"{package}-{version}"))
    else:
        prefix = Path(tempfile.gettempdir()) / f"agentgate-{package}-{version}"
        prefix.mkdir(exist_ok=True)
    manifest = prefix / "node_modules" / package / "package.json"
    if _manifest_version(manifest) != version:
        try:
            npm_install(npm, prefix, f"{package}@{version}", dict(os.environ), timeout=180)
        except InstallError as exc:
            pytest.skip(f"could not install {package}@{version} from the npm registry: {exc}")
        if _manifest_version(manifest) != version:
            pytest.skip(f"could not install {package}@{version} from the npm registry: not there after install")
    return prefix / "node_modules"


def _manifest_version(manifest: Path) -> str | None:
    try:
        return str(json.loads(manifest.read_text())["version"])
    except (OSError, ValueError, KeyError):
        return None


def install(prefix: Path) -> OpenClaw:
    """Node NODE_VERSION and openclaw@OPENCLAW_VERSION under `prefix`, installed when missing.

    Test workers (pytest-xdist) may ask at once: one installs while the others wait for it."""
    npm = shutil.which("npm")
    if npm is None:
        raise FileNotFoundError("npm is not installed")
    prefix.mkdir(parents=True, exist_ok=True)
    with (prefix / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return _install(prefix, npm)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _install(prefix: Path, npm: str) -> OpenClaw:
    node = prefix / "node" / "node_modules" / "node" / "bin" / "node"
    if _node_version(node) != f"v{NODE_VERSION}":
        npm_install(npm, prefix / "node", f"node@{NODE_VERSION}", dict(os.environ))
        found = _node_version(node)
        if found != f"v{NODE_VERSION}":
            raise InstallError(f"npm install node@{NODE_VERSION} gave {node} answering {found!r}")
    package = prefix / "openclaw" / "node_modules" / "openclaw"
    if _package_version(package) != OPENCLAW_VERSION or not (package / "openclaw.mjs").exists():
        # npm runs under the Node first on PATH: Node 24, not the machine's. Its install scripts
        # (a package-manager warning, bundled-plugin setup) are not needed by the clients, and
        # newer npm skips them anyway: never run them, so every npm installs the same files.
        env = {**os.environ, "PATH": f"{node.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        npm_install(npm, prefix / "openclaw", f"openclaw@{OPENCLAW_VERSION}", env, "--ignore-scripts")
        if _package_version(package) != OPENCLAW_VERSION:
            raise InstallError(f"npm install openclaw@{OPENCLAW_VERSION} left no such package in {package}")
    oc = OpenClaw(node=node, package=package)
    if not (oc.control_ui / "index.html").exists():
        raise InstallError(f"openclaw@{OPENCLAW_VERSION} ships no Control UI at dist/control-ui")
    return oc


def client_env(oc: OpenClaw, home: Path) -> dict[str, str]:
    """The environment of one client process: a private HOME and state, offline, Node 24 first."""
    home.mkdir(parents=True, exist_ok=True)
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("OPENCLAW_", "NODE_", "npm_", "TMUX"))}
    return {
        **inherited,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "OPENCLAW_STATE_DIR": str(home / ".openclaw"),
        # no update check, no version telemetry (OpenClaw's own switches)
        "OPENCLAW_NO_AUTO_UPDATE": "1",
        "DO_NOT_TRACK": "1",
        "NODE_NO_WARNINGS": "1",
        "PATH": f"{oc.node_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "xterm-256color",
    }


# --- waiting --------------------------------------------------------------------------------------


def wait_for(
    check: Callable[[], T], *, timeout: float, what: str, dump: Callable[[], str] | None = None, every: float = 0.05
) -> T:
    """Poll `check` until it returns something truthy; fail saying `what` and showing `dump()`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            shown = f"\n--- what was there ---\n{dump()}" if dump is not None else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{shown}")
        time.sleep(every)


# what OpenClaw's clients print when something went wrong ("think failed: …", "run error: …",
# "unknown method: …", "gateway disconnected: …", the TUI's "connected | error"); a status text
# that merely reports an earlier failed run ("last run failed (…)") is not one
ERROR_LINE = re.compile(
    r"failed:|error:|unknown method|invalid|needs scope|forbidden|disconnected|exception|cannot read|\| error\b",
    re.IGNORECASE,
)


def error_lines(text: str, *, allowed: tuple[str, ...] = ()) -> list[str]:
    """Lines that read as an error, except those containing one of `allowed`."""
    return [
        line.strip() for line in text.splitlines() if ERROR_LINE.search(line) and not any(ok in line for ok in allowed)
    ]


# --- the gateway, as a plain protocol client sees it -----------------------------------------------


def _in_thread(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on a loop of its own (Playwright's sync API holds a loop in the test's thread)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result(timeout=30)


class Gateway:
    """Read the server's view of one user's sessions over a real socket."""

    def __init__(self, server: ServerHandle, token: str) -> None:
        self.server = server
        self.token = token

    def call(self, method: str, params: dict[str, Any]) -> Any:
        async def go() -> Any:
            async with ws_client(self.server, self.token, subscribe=False) as client:
                return await client.ok(method, params)

        return _in_thread(go())

    def rows(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.call("sessions.list", {"limit": 500})["sessions"]
        return rows

    def row(self, key: str) -> dict[str, Any] | None:
        return next((r for r in self.rows() if r["key"] == key), None)

    def busy(self) -> list[dict[str, Any]]:
        """Sessions with a run still open: running, active or queued."""
        return [
            r
            for r in self.rows()
            if r["status"] == "running" or r["hasActiveRun"] or r["activeRunIds"] or r["queuedRunIds"]
        ]

    def open_runs(self) -> tuple[int, int]:
        """(active, queued) runs of this user's sessions, as `health` counts them."""
        health = self.call("health", {})
        return int(health["activeRuns"]), int(health["queuedRuns"])

    def assert_idle(self) -> None:
        busy = self.busy()
        assert not busy, f"sessions left with an open run: {json.dumps(busy, indent=1)[:3000]}"
        assert self.open_runs() == (0, 0), f"health still counts open runs: {self.open_runs()}"

    def wait_row(
        self, key: str, check: Callable[[dict[str, Any]], bool], what: str, timeout: float = 10
    ) -> dict[str, Any]:
        last: list[dict[str, Any] | None] = [None]

        def probe() -> dict[str, Any] | None:
            last[0] = self.row(key)
            return last[0] if last[0] is not None and check(last[0]) else None

        return wait_for(probe, timeout=timeout, what=f"{key}: {what}", dump=lambda: json.dumps(last[0], indent=1))


# --- the TUI in tmux ------------------------------------------------------------------------------

SPINNER = re.compile("[\u2800-\u28ff]")
BUSY_WORDS = ("streaming", "waiting", "sending", "running", "thinking", "loading")


class Tui:
    """`openclaw tui` in a tmux server of its own (its socket in `workdir`: never the user's tmux)."""

    def __init__(
        self, oc: OpenClaw, url: str, token: str, workdir: Path, *, width: int = 150, height: int = 50
    ) -> None:
        self.workdir = workdir
        self.socket = str(workdir / "tmux.sock")
        self.env = client_env(oc, workdir / "home")
        self.stderr = workdir / "tui-stderr.log"
        conf = workdir / "tmux.conf"
        conf.write_text("set -g remain-on-exit on\nset -g history-limit 20000\nset -g status off\n")
        command = [*oc.command("tui", "--url", url, "--token", token)]
        shell_line = " ".join(_quote(a) for a in command) + f" 2>>{_quote(str(self.stderr))}"
        self._tmux("-f", str(conf), "new-session", "-d", "-s", "tui", "-x", str(width), "-y", str(height), shell_line)

    def _tmux(self, *args: str) -> str:
        proc = subprocess.run(
            ["tmux", "-u", "-S", self.socket, *args], capture_output=True, text=True, env=self.env, timeout=20
        )
        if proc.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args[:3])} failed: {proc.stderr}")
        return proc.stdout

    def screen(self) -> str:
        """What is on the screen now (wrapped lines joined)."""
        return self._tmux("capture-pane", "-p", "-J", "-t", "tui")

    def history(self) -> str:
        """The whole pane: scrollback and screen."""
        return self._tmux("capture-pane", "-p", "-J", "-S", "-", "-t", "tui")

    def dead(self) -> bool:
        return self._tmux("display-message", "-p", "-t", "tui", "#{pane_dead}").strip() == "1"

    def dump(self) -> str:
        try:
            err = self.stderr.read_text(errors="replace")[-2000:]
        except OSError:
            err = ""
        return f"{self.screen()}\n--- stderr ---\n{err}"

    def type(self, text: str) -> None:
        self._tmux("send-keys", "-t", "tui", "-l", text)

    def press(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "tui", *keys)

    def submit(self, text: str) -> None:
        self.type(text)
        self.press("Enter")

    def status_line(self) -> str:
        """The activity line above the footer ("connected | idle", "⠼ streaming • 1s | connected")."""
        lines = [line for line in self.screen().splitlines() if line.strip()]
        footer = next((i for i in range(len(lines) - 1, -1, -1) if "| session " in lines[i]), None)
        if footer is None or footer == 0:
            return ""
        return lines[footer - 1].strip()

    def since(self, marker: str) -> str:
        """The screen from the last line that is `marker` (a message this test typed) to the end."""
        lines = self.screen().splitlines()
        at = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].strip() == marker), None)
        return "\n".join(lines[at:]) if at is not None else ""

    def wait_text(self, text: str, *, timeout: float = 15, after: str | None = None) -> str:
        def seen() -> str | None:
            part = self.since(after) if after is not None else self.history()
            return part if text in part else None

        return wait_for(seen, timeout=timeout, what=f"the TUI to show {text!r}", dump=self.dump)

    def wait_settled(self, word: str, *, timeout: float = 15) -> str:
        """Wait until the activity line says `word` (idle, aborted, error) with no spinner on it."""

        def settled() -> str | None:
            line = self.status_line()
            quiet = not SPINNER.search(line) and not any(w in line for w in BUSY_WORDS)
            return line if word in line and quiet else None

        return wait_for(settled, timeout=timeout, what=f"the TUI's activity line to settle on {word!r}", dump=self.dump)

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True, env=self.env, timeout=20)


def _quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"


# --- the ACP bridge over stdio --------------------------------------------------------------------


class AcpError(RuntimeError):
    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(json.dumps(error))
        self.error = error


class AcpBridge:
    """`openclaw acp`: JSON-RPC 2.0, one message a line, on the process's stdin and stdout."""

    def __init__(self, oc: OpenClaw, url: str, workdir: Path, *extra: str) -> None:
        self.stderr_path = workdir / "acp-stderr.log"
        self._stderr = self.stderr_path.open("wb")
        self.proc = subprocess.Popen(
            oc.command("acp", "--url", url, *extra),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=client_env(oc, workdir / "home"),
            cwd=workdir,
        )
        self._ids = itertools.count(1)
        self._lock = threading.Condition()
        self.responses: dict[int, dict[str, Any]] = {}
        self.notifications: list[dict[str, Any]] = []
        self.transcript: list[str] = []  # every line both ways, for failure messages
        self.unparsed: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _write(self, message: dict[str, Any]) -> None:
        line = json.dumps(message)
        self.transcript.append(f">> {line}")
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").strip()
            if not line:
                continue
            self.transcript.append(f"<< {line}")
            try:
                message = json.loads(line)
            except ValueError:
                self.unparsed.append(line)
                continue
            if "method" in message and "id" in message:
                # the agent asks the client something (permission, fs): this client offers nothing
                refusal = {"code": -32601, "message": "not offered by this client"}
                self._write({"jsonrpc": "2.0", "id": message["id"], "error": refusal})
                continue
            with self._lock:
                if "id" in message:
                    self.responses[message["id"]] = message
                else:
                    self.notifications.append(message)
                self._lock.notify_all()

    def start(self, method: str, params: dict[str, Any]) -> int:
        request_id = next(self._ids)
        self._write({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        return request_id

    def notify(self, method: str, params: dict[str, Any]) -> None:
        self._write({"jsonrpc": "2.0", "method": method, "params": params})

    def answer(self, request_id: int, timeout: float = 20) -> dict[str, Any]:
        """The response to `request_id` (result or error), waiting for it."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while request_id not in self.responses:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise AssertionError(
                        f"no answer to ACP request {request_id} within {timeout}s "
                        f"(bridge exit code {self.proc.poll()})\n{self.dump()}"
                    )
                self._lock.wait(min(left, 0.2))
            return self.responses[request_id]

    def result(self, request_id: int, timeout: float = 20) -> dict[str, Any]:
        message = self.answer(request_id, timeout)
        if "error" in message:
            raise AcpError(message["error"])
        result: dict[str, Any] = message["result"]
        return result

    def request(self, method: str, params: dict[str, Any], timeout: float = 20) -> dict[str, Any]:
        return self.result(self.start(method, params), timeout)

    def mark(self) -> int:
        """A position in the notifications, to read only what came after it."""
        with self._lock:
            return len(self.notifications)

    def updates(self, session_id: str, since: int = 0) -> list[dict[str, Any]]:
        with self._lock:
            found = list(self.notifications[since:])
        return [
            n["params"]["update"]
            for n in found
            if n.get("method") == "session/update" and n.get("params", {}).get("sessionId") == session_id
        ]

    def text(self, session_id: str, since: int = 0, kind: str = "agent_message_chunk") -> str:
        return "".join(
            u.get("content", {}).get("text", "")
            for u in self.updates(session_id, since)
            if u.get("sessionUpdate") == kind
        )

    def dump(self) -> str:
        try:
            err = self.stderr_path.read_text(errors="replace")[-2000:]
        except OSError:
            err = ""
        lines = "\n".join(line[:600] for line in self.transcript[-40:])
        return f"--- stdio (last 40 lines) ---\n{lines}\n--- stderr ---\n{err}"

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._stderr.close()


# --- the Control UI's files on loopback -----------------------------------------------------------


class _SiteHandler(http.server.SimpleHTTPRequestHandler):
    """The package's files as they are; a path with no file and no extension is a page of the
    single-page app, answered with index.html (as OpenClaw's own gateway serves it)."""

    def send_head(self) -> Any:
        path = self.path.split("?", 1)[0].split("#", 1)[0]
        if not os.path.exists(self.translate_path(path)) and "." not in path.rsplit("/", 1)[-1]:
            self.path = "/index.html"
        return super().send_head()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class StaticSite:
    """A threaded HTTP server on 127.0.0.1:`port` serving `root`."""

    def __init__(self, root: Path, port: int) -> None:
        handler = functools.partial(_SiteHandler, directory=str(root))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.port = port
        self.origin = f"http://127.0.0.1:{port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def control_ui_seed(site_origin: str, gateway_ws: str, session_key: str) -> str:
    """An init script that points the Control UI at `gateway_ws`, as its "Switch to this Gateway"
    confirmation would (the two localStorage entries it writes), so the first connect goes there."""
    here = site_origin.replace("http://", "ws://", 1)
    settings = {
        "gatewayUrl": gateway_ws,
        "sessionsByGateway": {
            gateway_ws: {"sessionKey": session_key, "lastActiveSessionKey": session_key, "selectedAgentId": "main"}
        },
    }
    entries = {
        f"openclaw.control.currentGateway.v1:{here}": gateway_ws,
        f"openclaw.control.settings.v1:{gateway_ws}": json.dumps(settings),
    }
    sets = "".join(f"localStorage.setItem({json.dumps(k)}, {json.dumps(v)});" for k, v in entries.items())
    seeded = "localStorage.setItem('agentgate.seeded', '1');"
    return f"try {{ if (!localStorage.getItem('agentgate.seeded')) {{ {sets} {seeded} }} }} catch (e) {{}}"
