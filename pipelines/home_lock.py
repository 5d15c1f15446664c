"""One `k3 run` or `k3 ui` at a time per home: an exclusive `flock` on `<K3_HOME>/k3.lock`.

Everything under a home is shared state: the sqlite Dagster and MLflow stores, the content-addressed
data, and the `work/` directories that a stage resumes from (keyed by its inputs, not its run). Two
commands on one home used to race: on a fresh home both ran MLflow's schema migrations at once
(`table _alembic_tmp_params already exists`, the store broken for good), and on a used one two runs
resumed from each other's `last/` checkpoint. Holding the lock for the whole command rules both out.

The kernel drops a `flock` when its holder dies, however it dies (kill -9 included), so a crashed
command never leaves a stale lock. What the lock file holds (the holder's pid, command and start
time) is only read to say who holds it; the flock itself is the truth.

    with hold_home(home, "k3 run --profile smoke", wait=False):
        ...  # the whole command
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import os
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
                raise HomeLocked(f"K3_HOME {home} is in use by {holder}; one run or UI at a time per "
                                 "home: wait for it to end, pass --wait to queue behind it, or use "
                                 "another K3_HOME") from None
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
