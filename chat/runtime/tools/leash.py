"""Launcher that ties an MCP stdio server's life to the gateway's: ``command_line([COMMAND, ARGS...])``.

Why: a stdio MCP server is a child process of the gateway. When the gateway exits normally, the pool
closes each server (stdin closed, then SIGTERM, then SIGKILL). But when the gateway is killed with
SIGKILL, or crashes hard, nothing runs: the children would be re-parented to init and live on as
orphans, holding files and ports, and a restarted gateway would start a second copy of each.

Linux lets a process ask the kernel for a signal when its parent dies (``prctl(PR_SET_PDEATHSIG)``),
and that request survives ``execve``. So this launcher, started by the gateway in place of the
configured command:

1. asks for SIGKILL on the parent's death;
2. checks that its parent is still the gateway (``AGENTGATE_LEASH_PARENT``): if the gateway died
   between the fork and the ``prctl``, the signal will never come, so the launcher exits instead;
3. writes its pid to ``AGENTGATE_LEASH_PIDFILE`` (the pool needs the pid to kill a server that
   ignores cancellation; ``exec`` keeps the pid, so it is the server's);
4. removes those two variables and ``exec``s the configured command, which keeps the death signal.

Process groups: the MCP SDK starts the server in a session (and process group) of its own, so a
Ctrl-C on the gateway's terminal does not hit the servers before the gateway can close them. That
does not weaken the leash: the death signal is per process, not per group. The pool kills a wedged
server with ``killpg`` on that group, which also takes the server's own children.

Limits: the kernel sends the signal when the *thread* that forked the child ends, so the pool must
start servers from a thread that lives as long as the gateway (its event loop thread). Only the
direct child is leashed: a server started through a wrapper (``npx``, ``uvx``) leaves its real
process as a grandchild, which is not killed on the gateway's death but sees end-of-file on its
stdin (the gateway held the other end) and exits as an MCP stdio server must. Elsewhere than Linux
there is no death signal, and the launcher only reports its pid and ``exec``s.

Only the standard library is used: the launcher runs as ``python -I -c SOURCE -- COMMAND...``,
before anything else. Its source travels on the command line, read by the parent (`command_line`),
not as a path: a process started as another user (the test suite's private PostgreSQL, run as
``postgres`` when the suite runs as root) cannot be relied on to read the checkout, which may sit
in a private folder or a home directory.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_ENV = "AGENTGATE_LEASH_PARENT"
PIDFILE_ENV = "AGENTGATE_LEASH_PIDFILE"
_PR_SET_PDEATHSIG = 1
_EXIT_USAGE = 64  # EX_USAGE
_EXIT_NO_PARENT = 70  # EX_SOFTWARE


def command_line(command: list[str], python: str = sys.executable) -> list[str]:
    """`command` under this launcher, run by `python`; the one way every caller builds it."""
    with open(__file__, encoding="utf-8") as f:  # no __file__ under -c: only ever called by a parent
        source = f.read()
    return [python, "-I", "-c", source, "--", *command]


def _set_parent_death_signal() -> None:
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(err)}")


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "--":
        sys.stderr.write("usage: leash.py -- COMMAND [ARGS...]\n")
        return _EXIT_USAGE
    command = argv[1:]
    parent = os.environ.pop(PARENT_ENV, None)
    pidfile = os.environ.pop(PIDFILE_ENV, None)
    _set_parent_death_signal()
    if parent is not None and os.getppid() != int(parent):
        # The gateway died before the death signal was armed: nobody will ever kill us.
        return _EXIT_NO_PARENT
    if pidfile:
        with open(pidfile, "w", encoding="ascii") as f:
            f.write(str(os.getpid()))
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        sys.stderr.write(f"leash: cannot run {command[0]!r}: {exc}\n")
        return 127
    return 0  # not reached: execvp does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
