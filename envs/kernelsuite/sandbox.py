"""Process isolation for submissions (research/environments.md §1.5, rule P1).

Each evaluation runs its submission in its own process, started in one of two ways:

- `"spawn"`: a fresh interpreter, `python -I _worker.py --session`, in a fresh temporary directory
  with a minimal environment. The strongest isolation; pays the torch import (about 3 s on the 2-core
  CI machine) every time.
- `"zygote"`: a fresh interpreter is started once per parent process, imports torch (and triton) and
  nothing else, and forks one child per evaluation. Each child is a separate process with a clean copy
  of that state; no submission ever ran in the zygote. About 30x cheaper to start, for RL and tests.

Either way the child talks to us only through two pipes with MAC'd frames (`_worker.py`), has a
deadline after which its whole process group is killed, and ends with `os._exit`. Its stdout and
stderr go to a log file whose tail is returned for feedback.

On the CPU (`WorkerEnv.jailed`, set by evaluate.py for device "cpu") the worker also runs in the
bubblewrap jail of envs/jail.py: uid 65534, own namespaces (no network, no host processes), a
read-only root of the system /usr, the system `python3 -I -S` with only torch's site-packages
(bound read-only at /opt/k3/site: .pth files are not processed, so the project's editable install
is not importable) and the worker script (read-only), the session's directory as the only writable
path, and the per-process and per-episode limits of KERNEL_LIMITS. "spawn" gets one jail per
session; "zygote" runs the zygote in one jail, its session directories under the jail's /workspace,
and the zygote itself reaps and kills its children (their pids are the jail's). On a GPU the worker
runs with the process isolation above only: the GPU machines have no bubblewrap (docs/kernelsuite.md).
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from envs.jail import JAIL_GID, JAIL_UID, WORKDIR, Jail, Limits

from . import _worker

WORKER_PATH = Path(_worker.__file__).resolve()
PACKAGE_DIR = WORKER_PATH.parent
ISOLATION_MODES = ("spawn", "zygote")
JAIL_WORKER = "/opt/k3/kernelsuite/_worker.py"
JAIL_SITE = "/opt/k3/site"
# torch needs far more address space and processes (threads count) than a shell command; the wall
# clock is the session's own deadline.
KERNEL_LIMITS = Limits(cpu_seconds=3600, memory_bytes=32 << 30, wall_seconds=3600, file_size_bytes=1 << 30,
                       open_files=4096, max_processes=512, episode_memory_bytes=8 << 30,
                       episode_cpu_seconds=10**6, cpus=float(os.cpu_count() or 1), tmp_bytes=256 << 20)


def _torch_site() -> str:
    import torch

    return str(Path(torch.__file__).resolve().parents[1])


def _jailed_popen(jail: Jail, args: list[str], env: dict[str, str], fds: tuple[int, ...], **popen) -> subprocess.Popen:
    """Start the worker script with `args` in `jail` (see the module docstring)."""
    argv = ["python3", "-I", "-S", JAIL_WORKER, "--sys-path", JAIL_SITE, *args]
    binds = ((str(WORKER_PATH), JAIL_WORKER), (_torch_site(), JAIL_SITE))
    env = {k: v for k, v in env.items() if k != "PATH"}  # the jail's own PATH stays
    with jail.prepare(argv, ro_binds=binds, env=env) as (full, bind_fds):
        return subprocess.Popen(full, pass_fds=(*fds, *bind_fds), stdin=subprocess.DEVNULL, cwd="/",
                                env={"PATH": "/usr/bin:/bin"}, start_new_session=True, **popen)


def _jail_home(prefix: str, parent: str | None = None) -> str:
    d = tempfile.mkdtemp(prefix=prefix, dir=parent)
    if os.geteuid() == 0:
        os.chown(d, JAIL_UID, JAIL_GID)
    return d


@dataclass(frozen=True)
class WorkerEnv:
    """What the child process's environment depends on: one zygote per distinct value."""

    triton_interpret: bool
    preload_triton: bool
    jailed: bool = False  # run the worker in the bubblewrap jail (the CPU; see the module docstring)

    def variables(self, home: str) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": home,
            "LANG": "C.UTF-8",
            # D2 on the CPU: every malloc'd block starts as 0x7F bytes (see _worker.POISON_BYTE); the
            # threshold keeps blocks up to 32 MiB on the heap, where the perturbation applies.
            "MALLOC_PERTURB_": str(_worker.MALLOC_PERTURB),
            "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
            "OMP_NUM_THREADS": "1",
            "TORCHINDUCTOR_COMPILE_THREADS": "1",
            "KERNELSUITE_PRELOAD_TRITON": "1" if self.preload_triton else "0",
        }
        for key in ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CUDA_HOME", "TRITON_PTXAS_PATH"):
            if key in os.environ:
                env[key] = os.environ[key]
        if self.triton_interpret:
            env["TRITON_INTERPRET"] = "1"
        return env


class WorkerDied(RuntimeError):
    """The child closed its channel or exited before answering."""


class Session:
    """One child process running one submission; request/response over MAC'd frames."""

    def __init__(self, isolation: str, env: WorkerEnv, timeout_s: float):
        if isolation not in ISOLATION_MODES:
            raise ValueError(f"isolation must be one of {ISOLATION_MODES}, not {isolation!r}")
        self._jail: Jail | None = None
        self._zygote = _Zygote.get(env) if isolation == "zygote" else None
        if env.jailed and self._zygote is not None:
            self.workdir = _jail_home("session-", self._zygote.home)
            self.job_workdir = f"{WORKDIR}/{os.path.basename(self.workdir)}"  # the worker's view of it
        elif env.jailed:
            self.workdir = _jail_home("kernelsuite-")
            self.job_workdir = WORKDIR
            self._jail = Jail(Path(self.workdir), KERNEL_LIMITS)
        else:
            self.workdir = tempfile.mkdtemp(prefix="kernelsuite-")
            self.job_workdir = self.workdir
        self.deadline = time.monotonic() + timeout_s
        self.token = secrets.token_bytes(_worker.TOKEN_BYTES)
        self.log_path = os.path.join(self.workdir, "worker.log")
        self.exit_code: int | None = None
        self._proc: subprocess.Popen | None = None
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            if self._jail is not None:
                self._proc = _jailed_popen(self._jail, ["--session", str(to_child_r), str(from_child_w)],
                                           env.variables(WORKDIR), (to_child_r, from_child_w),
                                           stdout=log_fd, stderr=log_fd)
                self.pid = self._proc.pid
            elif self._zygote is None:
                self._proc = subprocess.Popen(
                    [sys.executable, "-I", str(WORKER_PATH), "--session", str(to_child_r),
                     str(from_child_w)],
                    pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL, stdout=log_fd,
                    stderr=log_fd, cwd=self.workdir, env=env.variables(self.workdir),
                    start_new_session=True)
                self.pid = self._proc.pid
            else:
                self.pid = self._zygote.spawn(to_child_r, from_child_w, log_fd)
        finally:
            for fd in (to_child_r, from_child_w, log_fd):
                os.close(fd)
        _worker.write_all(self._to_child, self.token)

    def send(self, obj) -> None:
        try:
            _worker.send_message(self._to_child, self.token, obj)
        except (BrokenPipeError, OSError) as exc:
            raise WorkerDied(f"the worker stopped reading: {exc}") from exc

    def recv(self):
        try:
            return _worker.recv_message(self._from_child, self.token, self.deadline)
        except EOFError as exc:
            raise WorkerDied("the worker exited before answering") from exc

    def request(self, obj):
        self.send(obj)
        return self.recv()

    def log_tail(self, n_chars: int = 2000) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-n_chars:]
        except OSError:
            return ""

    def close(self, kill: bool = False) -> int | None:
        """End the child (killing its process group if asked or still running) and reap it."""
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        if self._proc is not None:
            try:
                self._proc.wait(timeout=0 if kill else 5)
            except subprocess.TimeoutExpired:
                _killpg(self.pid)
            self.exit_code = self._proc.wait()
        elif self._zygote is not None:
            if kill and not self._zygote.jailed:
                _killpg(self.pid)
            self.exit_code = self._zygote.wait(self.pid, kill_after_s=0 if kill else 5)
        if self._jail is not None:
            self._jail.close()
        shutil.rmtree(self.workdir, ignore_errors=True)
        return self.exit_code


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _Zygote:
    """A torch-loaded interpreter that forks evaluation children on request (see module docstring)."""

    _instances: dict[WorkerEnv, "_Zygote"] = {}
    _create_lock = threading.Lock()

    @classmethod
    def get(cls, env: WorkerEnv) -> "_Zygote":
        with cls._create_lock:
            zygote = cls._instances.get(env)
            if zygote is None or zygote.proc.poll() is not None:
                zygote = cls._instances[env] = cls(env)
            return zygote

    def __init__(self, env: WorkerEnv):
        self.lock = threading.Lock()
        self.jailed = env.jailed
        self.jail: Jail | None = None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        if env.jailed:
            self.home = _jail_home("kernelsuite-zygote-")
            self.jail = Jail(Path(self.home), KERNEL_LIMITS)
            self.proc = _jailed_popen(self.jail, ["--zygote", str(theirs.fileno())], env.variables(WORKDIR),
                                      (theirs.fileno(),), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        else:
            self.home = tempfile.mkdtemp(prefix="kernelsuite-zygote-")
            self.proc = subprocess.Popen(
                [sys.executable, "-I", str(WORKER_PATH), "--zygote", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, cwd=self.home, env=env.variables(self.home),
                start_new_session=True)
        theirs.close()
        self.sock = ours
        self.sock.settimeout(120)
        if self.sock.recv(64) != b"ready":
            raise RuntimeError("the kernelsuite zygote failed to start")
        atexit.register(self.stop)

    def spawn(self, fd_in: int, fd_out: int, fd_log: int) -> int:
        with self.lock:
            socket.send_fds(self.sock, [b"spawn"], [fd_in, fd_out, fd_log])
            return int(self.sock.recv(64))

    def wait(self, pid: int, kill_after_s: float) -> int:
        """Reap a child through the zygote (its parent); kill its group if it has not exited in time."""
        if self.jailed:
            # The pid is one of the jail's namespace: the zygote waits and kills.
            with self.lock:
                self.sock.send(f"wait {pid} {kill_after_s}".encode())
                return int(self.sock.recv(64))
        deadline = time.monotonic() + kill_after_s
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.01)
        if _alive(pid):
            _killpg(pid)
        with self.lock:
            self.sock.send(f"wait {pid}".encode())
            return int(self.sock.recv(64))

    def stop(self) -> None:
        try:
            self.sock.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            _killpg(self.proc.pid)
        if self.jail is not None:
            self.jail.close()
        shutil.rmtree(self.home, ignore_errors=True)


def _alive(pid: int) -> bool:
    """True while the process has not exited (a zombie waiting to be reaped counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
