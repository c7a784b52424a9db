"""The launcher's command line (chat/runtime/tools/leash.py, `command_line`), run for real.

No database: each test starts a real process under the launcher and reads what it did.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from chat.runtime.tools import leash

pytestmark = pytest.mark.timeout(30)


def test_the_command_runs_in_the_launchers_place_and_without_its_variables(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    env = {**os.environ, leash.PARENT_ENV: str(os.getpid()), leash.PIDFILE_ENV: str(pidfile)}
    script = f'echo "$$ ${{{leash.PARENT_ENV}-unset}} ${{{leash.PIDFILE_ENV}-unset}}" "$@"'
    proc = subprocess.run(
        leash.command_line(["sh", "-c", script, "sh", "two words"]),
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert proc.returncode == 0, proc.stderr
    pid, parent, pidfile_var, *args = proc.stdout.split(" ", 3)
    assert pidfile.read_text() == pid  # exec'd: the launcher's pid is the command's
    assert (parent, pidfile_var) == ("unset", "unset")
    assert args == ["two words\n"]  # the command's arguments, passed on as they were


def _leash_from(folder: Path) -> ModuleType:
    """The launcher's module as loaded from a copy in `folder` (as a checkout there would hold it)."""
    copy = folder / "leash.py"
    shutil.copyfile(leash.__file__, copy)
    spec = importlib.util.spec_from_file_location("leash_in_a_private_checkout", copy)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(os.geteuid() != 0, reason="starts a process as another user, which needs root")
def test_another_user_runs_under_the_launcher_from_a_checkout_it_cannot_read(tmp_path: Path) -> None:
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("there is no `nobody` user to start a process as")
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("there is no system python3 for another user to run")
    private = tmp_path / "private"  # like a checkout cloned into `mktemp -d`, or a home directory
    checkout = private / "checkout"
    checkout.mkdir(parents=True)
    private.chmod(0o700)
    module = _leash_from(checkout)
    proc = subprocess.run(
        module.command_line(["id", "-u"], python),
        env={**os.environ, leash.PARENT_ENV: str(os.getpid())},
        cwd=checkout,  # where the test suite starts its private PostgreSQL from
        user=nobody.pw_uid,
        group=nobody.pw_gid,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(nobody.pw_uid)
