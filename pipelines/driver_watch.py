"""A Ray task that dies with its driver: a watchdog thread that exits the worker when the driver
process is gone.

Ray starts workers under its raylet, in their own process groups, so a `kill -9` of `k3 run` (no
handler runs, nothing is cancelled) left the stage's task training and writing checkpoints into the
home for seconds, until Ray noticed its job was dead. `RayResource` now runs every task through
`run_watched`, which polls the driver twice a second and ends the worker at once (`os._exit`)
when it is gone.

A process is identified by its pid *and* its start time (`/proc/<pid>/stat` field 22), so a pid
that the kernel has since given to another process does not count as the driver. On another host
(a joined multi-node cluster) the driver's pid means nothing; the watchdog then stays off and Ray's
own job clean-up applies.

This module imports neither dagster nor ray: it runs in the worker.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

POLL_S = 0.5


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None when there is no such process.
    Without /proc (not Linux), 0 for any live pid."""
    try:
        stat = open(f"/proc/{pid}/stat", "rb").read()
    except FileNotFoundError:
        return None
    except OSError:
        stat = None
    if stat is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return 0
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat[stat.rindex(b")") + 2:].split()
    if fields[0] == b"Z":  # a zombie has exited; only its parent has not reaped it
        return None
    return int(fields[19])


@dataclass(frozen=True)
class Driver:
    pid: int
    start_ticks: int | None
    host: str

    @classmethod
    def this_process(cls) -> "Driver":
        pid = os.getpid()
        return cls(pid, process_start_ticks(pid), socket.gethostname())

    def alive(self) -> bool:
        ticks = process_start_ticks(self.pid)
        return ticks is not None and (self.start_ticks in (None, 0) or ticks == self.start_ticks)


def watch(driver: Driver, poll_s: float = POLL_S,
          on_gone: Callable[[], None] | None = None) -> threading.Thread | None:
    """Start the watchdog thread (a daemon); None when the driver is on another host."""
    if driver.host != socket.gethostname():
        return None

    def loop() -> None:
        stop = threading.Event()
        while driver.alive():
            stop.wait(poll_s)
        if on_gone is not None:
            on_gone()
            return
        print(f"driver process {driver.pid} is gone: stopping this task (pid {os.getpid()})",
              file=sys.stderr, flush=True)
        os._exit(1)

    thread = threading.Thread(target=loop, name="k3-driver-watchdog", daemon=True)
    thread.start()
    return thread


def run_watched(driver: Driver, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`, ended with the worker if the driver dies first."""
    watch(driver)
    return fn(*args)
