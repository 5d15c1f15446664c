"""What every `k3` command shares (pipelines/cli.py, pipelines/ui.py): its one-line messages, the
home's lock around its set-up, and the handling of SIGINT/SIGTERM.

A `k3` command reports in plain lines (`say`), flushed at once so a log that tails it sees them. It
sets the home up and cleans up after crashed runs under the home's lock (`under_home_lock`,
pipelines/home_lock.py, pipelines/recovery.py). SIGINT and SIGTERM take the Ctrl-C path
(`stop_on_signals`), and every SIGINT/SIGTERM is also noted by a thread
(`watch_interrupts`), because the handler's own exception can be lost.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from collections.abc import Callable

from pipelines.resources import k3_home


def say(msg: str) -> None:
    """One line to stdout, flushed at once, so a log that tails the command sees it."""
    print(msg, flush=True)


def raise_keyboard_interrupt(signum, frame) -> None:
    """A SIGTERM handler: the Ctrl-C path (Ray tasks cancelled, the run recorded as failed)."""
    raise KeyboardInterrupt


def stop_on_signals() -> None:
    """SIGINT and SIGTERM both raise KeyboardInterrupt in the main thread. SIGINT is set explicitly:
    a command started in the background of a non-interactive shell (`make test &`, CI) inherits it
    ignored, and Python then installs no handler of its own, so `kill -INT` would do nothing."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, raise_keyboard_interrupt)


def watch_interrupts() -> None:
    """Note every SIGINT/SIGTERM (`assets.ray_task.note_interrupt`) from a thread reading the signal
    wakeup fd, to which Python's C-level handler writes whatever Python handler is in force (Dagster
    swaps them during a step). The handler's own exception can be lost (assets.ray_task.interrupted);
    the long waits check the note."""
    from assets.ray_task import note_interrupt
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def watch() -> None:
        while data := os.read(read_fd, 64):
            if signal.SIGINT in data or signal.SIGTERM in data:
                note_interrupt()

    threading.Thread(target=watch, daemon=True, name="k3-interrupt-watch").start()


def under_home_lock(who: str, profile: str | None, args: argparse.Namespace,
                    body: Callable[[argparse.Namespace, str | None, dict[str, str]], int]) -> int:
    """`body(args, profile, env)` after setting the home up and cleaning up crashed runs under the
    home's lock, which is then released: `k3 ui` and `k3 run` share a home (pipelines/home_lock.py,
    pipelines/recovery.py). `k3 ui` has no profile (None)."""
    from pipelines.home_lock import HomeLocked, HomeNotWritable, hold_home
    from pipelines.instance import apply_k3_environ
    from pipelines.recovery import prepare_home
    home = k3_home()
    try:
        command = f"{who} --profile {profile}" if profile else who
        # The set-up takes seconds: queue behind another command's instead of refusing.
        with hold_home(home, command, wait=True, say=lambda m: say(f"{who}: {m}")):
            env = apply_k3_environ(profile, home)
            prepare_home(home, who, say)
        return body(args, profile, env)
    except (HomeLocked, HomeNotWritable) as e:
        say(f"{who}: {e}")
        return 1
