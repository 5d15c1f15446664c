"""What must be exclusive on a home, and only that: two `flock`s.

  `<K3_HOME>/k3.lock`  held by `k3 run` and `k3 ui` while they set the home up (`hold_home`):
                       creating the MLflow store, whose schema migrations must run once, by one
                       process (two at once on a fresh home broke it for good: `table
                       _alembic_tmp_params already exists`), and the crash clean-up of
                       pipelines/recovery.py. Released before the run or the UI starts, so
                       `k3 ui` and `k3 run` (or two runs) work on one home at once.
  `.<work dir>.lock`   held by a run while a stage trains in its work directory
                       (`hold_work_dir`): the directory is keyed by the stage's inputs, not the
                       run, so two runs of the same stage on the same inputs would resume from each
                       other's `last/` checkpoint. The second waits for the first.

Everything else is safe to share: the sqlite stores take concurrent writers (Dagster's and MLflow's
own locking), data and checkpoints are content-addressed and published by rename, and a Dagster
run's Ray cluster is its own.

The kernel drops a `flock` when its holder dies, however it dies (kill -9 included), so a crashed
command never leaves a stale lock. What a lock file holds (the holder's pid, command and start
time) is only read to say who holds it; the flock itself is the truth. On a shared filesystem the
locks need a filesystem whose flock is cluster-wide (NFSv4, Lustre, CephFS, GPFS; not NFSv3 without
lockd).

    with hold_home(home, "k3 run --profile smoke", wait=False):
        ...  # create the stores, clean up crashed runs
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

LOCK_FILE = "k3.lock"


class HomeLocked(RuntimeError):
    """Another command holds the home's lock."""


class HomeNotWritable(RuntimeError):
    """The home (or its lock file) cannot be created or written."""


def _holder(path: Path) -> dict:
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


def describe_holder(path: Path) -> str:
    info = _holder(path)
    if not info:
        return "another k3 command (its pid is not recorded yet)"
    return f"`{info.get('command', 'k3')}` (pid {info.get('pid', '?')}, since {info.get('since', '?')})"


def _open_lock(home: Path) -> int:
    try:
        home.mkdir(parents=True, exist_ok=True)
        return os.open(home / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise HomeNotWritable(
            f"K3_HOME {home} is not writable ({e.strerror}: {e.filename}): a run keeps its history, "
            "data and checkpoints there; point K3_HOME at a writable directory") from e


@contextlib.contextmanager
def hold_home(home: Path, command: str, wait: bool = False,
              say: Callable[[str], None] = print) -> Iterator[Path]:
    """Hold `<home>/k3.lock` exclusively for the body. Without `wait`, a held lock raises HomeLocked
    naming its holder; with it, `say` announces the wait and the call blocks until the holder ends
    (a signal that raises, such as Ctrl-C, still interrupts the wait)."""
    home = Path(home)
    path = home / LOCK_FILE
    fd = _open_lock(home)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            holder = describe_holder(path)
            if not wait:
                raise HomeLocked(f"K3_HOME {home} is being set up by {holder} (store creation, crash "
                                 "clean-up; seconds): try again, or pass --wait to queue behind it") from None
            say(f"waiting for {holder} to release K3_HOME {home}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        stamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "command": command, "since": stamp}).encode(), 0)
        try:
            yield home
        finally:
            os.ftruncate(fd, 0)
    finally:
        # Closing the descriptor releases the flock.
        os.close(fd)


@contextlib.contextmanager
def hold_work_dir(work_dir: Path, label: str, say: Callable[[str], None] = print,
                  interrupted: Callable[[], bool] = lambda: False, poll_s: float = 1.0) -> Iterator[Path]:
    """Hold `.<work_dir name>.lock` (beside the directory, which is removed once its stage is
    promoted; hidden, so a listing of the stage's work directories shows only directories)
    exclusively for the body, waiting for another holder and saying whom it waits for. The wait
    polls, so an interruption noted by `interrupted` (pipelines.console's signal thread) ends it."""
    work_dir = Path(work_dir)
    path = work_dir.parent / f".{work_dir.name}.lock"
    work_dir.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        said = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
            if not said:
                say(f"{label}: waiting for {describe_holder(path)}, which trains in {work_dir}")
                said = True
            if interrupted():
                raise KeyboardInterrupt
            time.sleep(poll_s)
        os.ftruncate(fd, 0)
        stamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "command": label, "since": stamp}).encode(), 0)
        try:
            yield work_dir
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)
