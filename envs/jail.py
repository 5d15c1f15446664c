"""Run an untrusted shell command with CPU, memory, file-size and wall-clock limits, no network and
an empty environment.

What is enforced, in order of strength:
- Limits (setrlimit, applied by util-linux `prlimit` just before the command is exec'd, or by
  `resource.setrlimit` in a `preexec_fn` where `prlimit` is missing; the first is safe in threaded
  callers such as RL actors): RLIMIT_CPU (SIGXCPU, then SIGKILL a second later), RLIMIT_AS
  (allocation fails: MemoryError in Python), RLIMIT_FSIZE (SIGXFSZ; also caps the captured output,
  which goes to a file), RLIMIT_NOFILE, RLIMIT_CORE = 0. Wall clock: the command runs
  in its own session and the whole process group is SIGKILLed at the deadline; the group is also
  killed after a normal exit, so background jobs do not outlive the call.
- Environment: the child gets only PATH (a shim dir with `python`/`python3` pointing at this
  interpreter, then /usr/bin:/bin), HOME = the working directory, LANG, and PYTHONPATH = a directory
  with a `sitecustomize.py` that makes every Python socket call raise. Nothing of the parent's
  environment is inherited.
- Network: the command runs under `unshare --net` (a new, empty network namespace: no interfaces but
  a down loopback), or `unshare --user --map-root-user --net` where only unprivileged user namespaces
  are allowed. If neither works, a warning is logged and only the Python-level socket block remains
  (a non-Python program could then reach the network); `network_isolation()` says which is in force.
- Not enforced: the file system. The command runs as the calling user with the working directory as
  cwd; it is not chrooted. Secrets must therefore never be on disk while an episode runs (hidden
  tests are written only after the episode ends, see tasks/coding.py).
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_SITECUSTOMIZE = '''\
"""Installed by envs.jail: no network from Python inside the sandbox."""
import socket as _socket


def _blocked(*args, **kwargs):
    raise OSError("network access is disabled in this sandbox")


class _NoSocket(_socket.socket):
    def __init__(self, *args, **kwargs):
        _blocked()


_socket.socket = _NoSocket
_socket.create_connection = _blocked
_socket.getaddrinfo = _blocked
_socket.socketpair = _blocked
'''


@dataclass(frozen=True)
class Limits:
    cpu_seconds: int = 10
    memory_bytes: int = 1 << 30
    wall_seconds: float = 20.0
    file_size_bytes: int = 32 << 20
    open_files: int = 256
    output_chars: int = 20_000


@dataclass(frozen=True)
class CommandResult:
    exit_code: int  # the shell's exit code; 128 + signal number when killed by a signal
    output: str  # stdout and stderr interleaved, truncated to Limits.output_chars
    status: str  # "exited" | "cpu_limit" | "wall_limit" | "output_limit" | "signal"
    wall_seconds: float


@functools.lru_cache(maxsize=1)
def _support_dir() -> Path:
    """A per-process directory with the python shim and the socket-blocking sitecustomize."""
    d = Path(tempfile.mkdtemp(prefix="k3-jail-"))
    atexit.register(shutil.rmtree, d, True)
    (d / "site").mkdir()
    (d / "site" / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    (d / "bin").mkdir()
    for name in ("python", "python3"):
        os.symlink(sys.executable, d / "bin" / name)
    return d


@functools.lru_cache(maxsize=1)
def _net_prefix() -> tuple[str, ...]:
    for prefix in (("unshare", "--net", "--"), ("unshare", "--user", "--map-root-user", "--net", "--")):
        try:
            ok = subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.SubprocessError):
            ok = False
        if ok:
            return prefix
    log.warning(
        "envs.jail: cannot create a network namespace (unshare unavailable or not permitted); "
        "only Python sockets are blocked inside the sandbox"
    )
    return ()


def network_isolation() -> str:
    """Which network block is in force: "netns", "userns+netns" or "python-sockets-only"."""
    prefix = _net_prefix()
    if not prefix:
        return "python-sockets-only"
    return "netns" if "--user" not in prefix else "userns+netns"


def sandbox_env(home: Path) -> dict[str, str]:
    support = _support_dir()
    return {
        "PATH": f"{support / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(support / "site"),
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def _rlimits(limits: Limits) -> list[tuple[int, str, int, int]]:
    """(resource, prlimit option, soft, hard) for every limit we set."""
    cpu = max(1, int(limits.cpu_seconds))
    return [
        (resource.RLIMIT_CPU, "--cpu", cpu, cpu + 1),
        (resource.RLIMIT_AS, "--as", limits.memory_bytes, limits.memory_bytes),
        (resource.RLIMIT_FSIZE, "--fsize", limits.file_size_bytes, limits.file_size_bytes),
        (resource.RLIMIT_NOFILE, "--nofile", limits.open_files, limits.open_files),
        (resource.RLIMIT_CORE, "--core", 0, 0),
    ]


def _limit_child(limits: Limits) -> None:
    """Runs in the child between fork and exec (only where prlimit is missing)."""
    for res, _, soft, hard in _rlimits(limits):
        resource.setrlimit(res, (soft, hard))


@functools.lru_cache(maxsize=1)
def _prlimit() -> str | None:
    path = shutil.which("prlimit")
    if path is None:
        log.warning("envs.jail: prlimit not found; limits are set in a preexec_fn instead")
    return path


def run_argv(argv: list[str], cwd: Path, limits: Limits, stdin_text: str = "") -> CommandResult:
    """Run argv (no shell) inside the jail; see the module docstring for what that means."""
    cwd = Path(cwd)
    with tempfile.TemporaryFile(prefix="k3-out-") as out:
        start = time.monotonic()
        prlimit = _prlimit()
        limit_argv = [prlimit, *(f"{opt}={soft}:{hard}" for _, opt, soft, hard in _rlimits(limits)), "--"] if prlimit else []
        proc = subprocess.Popen(
            [*_net_prefix(), *limit_argv, *argv],
            cwd=cwd,
            env=sandbox_env(cwd),
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=None if prlimit else (lambda: _limit_child(limits)),
            close_fds=True,
        )
        wall_hit = False
        try:
            proc.communicate(stdin_text.encode(), timeout=limits.wall_seconds)
        except subprocess.TimeoutExpired:
            wall_hit = True
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        wall = time.monotonic() - start
        out.seek(0)
        raw = out.read(limits.output_chars * 4 + 4)
    text = raw.decode("utf-8", errors="replace")
    if len(text) > limits.output_chars:
        text = text[: limits.output_chars] + f"\n... [output truncated at {limits.output_chars} chars]"
    rc = proc.returncode
    code = 128 - rc if rc < 0 else rc
    if wall_hit:
        status = "wall_limit"
    elif rc in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        status = "cpu_limit"
    elif rc in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ):
        status = "output_limit"
    elif rc < 0:
        status = "signal"
    else:
        status = "exited"
    return CommandResult(exit_code=code, output=text, status=status, wall_seconds=wall)


def run_command(command: str, cwd: Path, limits: Limits = Limits()) -> CommandResult:
    """Run a bash command line inside the jail."""
    return run_argv(["/bin/bash", "--noprofile", "--norc", "-c", command], cwd, limits)
