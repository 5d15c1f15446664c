"""What is exclusive on a home (pipelines/home_lock.py): its set-up (a held one refused with the
holder's pid or waited for, freed by kill -9), two concurrent runs on a fresh home (both succeed,
the MLflow store intact), `k3 ui` beside a run, a stage's work directory (a second process waits
for the first, freed by kill -9), a read-only home."""

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from pipelines.home_lock import LOCK_FILE, HomeLocked, HomeNotWritable, hold_home, hold_work_dir

K3 = str(Path(sys.executable).parent / "k3")
# A process that holds the lock of the home in argv[1] until it is killed.
HOLDER = ("import sys, time; from pathlib import Path; from pipelines.home_lock import hold_home\n"
          "with hold_home(Path(sys.argv[1]), 'k3 run --profile smoke'):\n"
          "    print('held', flush=True); time.sleep(600)\n")


def _k3(args, home, **kw):
    env = {**os.environ, "K3_HOME": str(home)}
    env.pop("DAGSTER_HOME", None)
    return subprocess.Popen([K3, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def _holder(home):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(home)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_held_home_is_refused_with_the_holders_pid_waited_for_and_freed_by_kill_9(tmp_path):
    holder = _holder(tmp_path)
    try:
        with pytest.raises(HomeLocked) as err, hold_home(tmp_path, "k3 run"):
            pass
        assert f"is being set up by `k3 run --profile smoke` (pid {holder.pid}," in str(err.value)
        assert "--wait" in str(err.value)

        said, got = [], threading.Event()

        def waiter():
            with hold_home(tmp_path, "k3 ui", wait=True, say=said.append):
                got.set()
        thread = threading.Thread(target=waiter, daemon=True)
        thread.start()
        time.sleep(1.0)
        assert not got.is_set() and said and f"pid {holder.pid}" in said[0]
        # No handler runs on SIGKILL: the kernel drops the flock with the process.
        holder.kill()
        holder.wait()
        assert got.wait(timeout=60), "the lock was not released by the holder's death"
        thread.join(timeout=60)
    finally:
        holder.kill()
        holder.wait()
    assert (tmp_path / LOCK_FILE).read_text() == ""


def test_two_runs_at_once_on_a_fresh_home(tmp_path):
    """The bug the set-up lock prevents: both ran MLflow's migrations at once and broke the store for
    good. Now the second waits for the first's set-up, then both run, and the store works."""
    home = tmp_path / "home"
    first = _k3(["run", "--profile", "smoke", "--select", "corpus"], home)
    deadline = time.monotonic() + 120
    while not ((home / LOCK_FILE).exists() and (home / LOCK_FILE).read_text()):
        assert first.poll() is None and time.monotonic() < deadline, first.stdout.read()
        time.sleep(0.05)
    second = _k3(["run", "--profile", "smoke", "--select", "corpus"], home)
    outs = [p.communicate(timeout=300)[0] for p in (first, second)]
    assert first.returncode == 0 and "k3 run: success" in outs[0], outs[0]
    # The second queued behind the first's set-up, then built the corpus too or found it fresh.
    assert second.returncode == 0 and "waiting for `k3 run --profile smoke`" in outs[1], outs[1]
    assert "k3 run: success" in outs[1] or "nothing to materialize" in outs[1], outs[1]
    client = MlflowClient(f"sqlite:///{home / 'mlflow' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("k3").experiment_id])
    # The second either built the corpus too or found the first's fresh: one or two finished runs.
    assert {(r.data.tags["asset"], r.info.status) for r in runs} == {("smoke/corpus", "FINISHED")}


@pytest.mark.e2e
@pytest.mark.slow
def test_k3_ui_starts_beside_a_run_and_refuses_a_busy_port(tmp_path):
    """A home whose set-up is done is not held: `k3 ui` starts while another command is at work on it
    (a holder of a stage's work directory stands for a training run)."""
    home = tmp_path / "home"
    free = [_free_port(), _free_port()]
    with socket.socket() as busy, hold_work_dir(home / "work" / "smoke" / "x" / "key", "k3 run"):
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        taken = _k3(["ui", "--port", str(port), "--mlflow-port", str(free[1])], home)
        out_taken = taken.communicate(timeout=300)[0]
        ui = _k3(["ui", "--port", str(free[0]), "--mlflow-port", str(free[1])], home, start_new_session=True)
        try:
            deadline = time.monotonic() + 240
            lines = []
            while time.monotonic() < deadline:
                line = ui.stdout.readline()
                assert line or ui.poll() is None, "".join(lines)
                lines.append(line)
                if "Ctrl-C stops both" in line:
                    break
            assert "Ctrl-C stops both" in "".join(lines), "".join(lines)
        finally:
            os.killpg(ui.pid, signal.SIGTERM)
            ui.communicate(timeout=120)
    assert taken.returncode == 1 and f"port {port} on 127.0.0.1 is already in use" in out_taken, out_taken


WORK_HOLDER = ("import sys, time; from pathlib import Path; from pipelines.home_lock import hold_work_dir\n"
               "with hold_work_dir(Path(sys.argv[1]), 'smoke/sft_policy'):\n"
               "    print('held', flush=True); time.sleep(600)\n")


def test_a_work_directory_is_held_by_one_process_and_freed_by_kill_9(tmp_path):
    work = tmp_path / "work" / "smoke" / "sft_policy" / "abc123"
    holder = subprocess.Popen([sys.executable, "-c", WORK_HOLDER, str(work)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        said, got, stop = [], threading.Event(), threading.Event()

        def waiter():
            try:
                with hold_work_dir(work, "smoke/sft_policy", say=said.append, interrupted=stop.is_set, poll_s=0.1):
                    got.set()
            except KeyboardInterrupt:
                pass
        thread = threading.Thread(target=waiter, daemon=True)
        thread.start()
        time.sleep(1.0)
        assert not got.is_set() and said and f"pid {holder.pid}" in said[0] and str(work) in said[0]
        # Another stage's directory is not held.
        with hold_work_dir(work.parent / "other", "smoke/sft_policy"):
            pass
        holder.kill()
        holder.wait()
        assert got.wait(timeout=60), "the work directory was not released by its holder's death"
        thread.join(timeout=60)
    finally:
        holder.kill()
        holder.wait()
    # A wait ends on an interruption (pipelines.console notes SIGINT/SIGTERM).
    with hold_work_dir(work, "a"):
        with pytest.raises(KeyboardInterrupt):
            with hold_work_dir(work, "b", interrupted=lambda: True, poll_s=0.01):
                pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read_only_command(home: Path, argv: list[str]) -> list[str]:
    """argv run with `home` read-only: a private read-only bind mount when root (chmod does not
    stop root), else a directory without write permission."""
    if os.geteuid() != 0:
        home.chmod(0o555)
        return argv
    if shutil.which("unshare") is None:
        pytest.skip("running as root without unshare: cannot make a read-only home")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"running as root and unshare -m is not permitted: {probe.stderr.decode().strip()}")
    quoted = " ".join(shlex.quote(a) for a in argv)
    return ["unshare", "-m", "sh", "-c", f"mount --bind -o ro {shlex.quote(str(home))} {shlex.quote(str(home))} "
            f"&& exec {quoted}"]


def test_a_read_only_home_gives_one_clear_line(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    hold = subprocess.run(_read_only_command(home, [sys.executable, "-c", "from pathlib import Path; "
                                                    "from pipelines.home_lock import hold_home; "
                                                    f"hold_home(Path('{home}'), 'x').__enter__()"]),
                          capture_output=True, text=True, timeout=120)
    assert "HomeNotWritable" in hold.stderr and f"K3_HOME {home} is not writable" in hold.stderr
    proc = subprocess.run(_read_only_command(home, [K3, "run", "--profile", "smoke", "--select", "corpus"]),
                          env={**os.environ, "K3_HOME": str(home)}, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert f"k3 run: K3_HOME {home} is not writable" in out and "point K3_HOME at a writable directory" in out
    assert "Traceback" not in out and len(out.strip().splitlines()) == 1, out
    if os.geteuid() != 0:
        home.chmod(0o755)


def test_home_not_writable_is_its_own_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(HomeNotWritable, match="is not writable"), hold_home(tmp_path / "file" / "home", "k3 run"):
        pass
