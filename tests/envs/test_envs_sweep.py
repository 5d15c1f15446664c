"""Leftovers of a killed run (episode cgroups, sandbox folders) are swept at the next start; a live
run's, and anything this project did not name, are left alone."""

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from envs import jail, sandbox
from envs.sandbox import Sandbox

# A run that opens a sandbox, runs a command in it (so its episode cgroups are in use), prints what
# it made, then either dies by SIGKILL (no finalizer runs) or waits for its stdin to close.
_CHILD = """
import json, os, signal, sys
from envs.sandbox import Sandbox
sb = Sandbox()
assert sb.run("echo hi").output.strip() == "hi"
print(json.dumps({"root": str(sb.root), "cgroups": sorted(str(d) for d in set(sb.jail.cgroup.dirs.values()))}), flush=True)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
sys.stdin.read()
sb.close()
"""


def _start(mode: str) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    made = json.loads(proc.stdout.readline())
    return proc, made


def test_a_killed_runs_cgroups_and_folders_are_swept_at_the_next_start_and_a_live_runs_stay():
    killed, dead = _start("kill")
    assert killed.wait(30) == -signal.SIGKILL
    assert Path(dead["root"]).is_dir()  # left by the kill (no finalizer ran)
    assert all(Path(d).is_dir() for d in dead["cgroups"])
    # The next run's first sandbox sweeps them (here the live run starting), and this process's too.
    live, alive = _start("live")
    assert not Path(dead["root"]).exists()
    assert not any(Path(d).exists() for d in dead["cgroups"])
    killed, dead = _start("kill")
    assert killed.wait(30) == -signal.SIGKILL
    tmp = Path(tempfile.gettempdir())
    # A folder whose pid is live but whose start time is not that process's: the pid was reused.
    reused = tmp / f"{sandbox._SANDBOX_PREFIX}1.{(jail._start_ticks(1) or 0) + 10 ** 9}-reused"
    # Folders of a live process (pid 1 at its true start) and one not named by this project stay.
    init_owned = tmp / f"{sandbox._SANDBOX_PREFIX}1.{jail._start_ticks(1)}-live"
    foreign = tmp / f"{sandbox._SANDBOX_PREFIX}notours"
    for d in (reused, init_owned, foreign):
        d.mkdir()
    try:
        assert Path(dead["root"]).is_dir() and all(Path(d).is_dir() for d in dead["cgroups"])
        sandbox._sweep_stale_sandboxes.cache_clear()  # a fresh process: the sweep runs at its first sandbox
        jail._sweep_stale_cgroups.cache_clear()
        sb = Sandbox()
        try:
            assert not Path(dead["root"]).exists()
            assert not any(Path(d).exists() for d in dead["cgroups"])
            assert not reused.exists()
            assert Path(alive["root"]).is_dir() and all(Path(d).is_dir() for d in alive["cgroups"])
            assert init_owned.is_dir() and foreign.is_dir()
            assert live.poll() is None
        finally:
            sb.close()
    finally:
        live.stdin.close()
        live.wait(30)
        for d in (reused, init_owned, foreign):
            if d.exists():
                d.rmdir()
    assert not Path(alive["root"]).exists()  # the live run cleaned up after itself when it ended


def test_owner_tags_name_this_process_and_tell_dead_and_reused_pids():
    tag = jail.owner_tag()
    assert not jail.owner_is_dead(tag + "-0")
    pid, start = map(int, tag.split("."))
    assert jail.owner_is_dead(f"{pid}.{start + 1}-0")  # same pid, another start: another process
    assert not jail.owner_is_dead("notapid")  # not ours to judge
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    assert jail.owner_is_dead(f"{dead.pid}-legacy") and jail.owner_is_dead(f"{dead.pid}.5-x")
