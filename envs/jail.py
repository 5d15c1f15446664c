"""Run an untrusted command in a bubblewrap sandbox: own namespaces, an unprivileged uid, a read-only
minimal root, the workspace as the only writable path, and per-process and per-episode limits.

Every command runs as

    sh -c 'echo $$ > <cgroup>/cgroup.procs ...; exec "$@"'    # join the episode's cgroups (when writable)
      prlimit --cpu --as --fsize --nofile --core [--nproc] --  # per-process rlimits, inherited by all
        setpriv --reuid=65534 --regid=65534 --clear-groups ...  # only when we are root
          bwrap --unshare-all --die-with-parent --new-session ... -- COMMAND

What the command sees and can do:
- New user, mount, pid, network, IPC, UTS and cgroup namespaces (`--unshare-all`). Its uid is 65534
  (nobody) on the host too when the caller is root (setpriv drops to it before bwrap, which then runs
  unprivileged), else the caller's own uid; it holds no capability outside its namespaces.
- The file system is a fresh read-only root holding only: the host's /usr (read-only, with the
  /bin, /lib, /lib64, /sbin links of a merged-/usr system), /etc/alternatives and /etc/ld.so.cache
  (read-only), a new /proc of its own pid namespace (no host process is visible), a minimal /dev
  (null, zero, full, random, urandom, tty, shm), a fresh size-limited /tmp, `python`/`python3` links
  to the system interpreter (/usr/bin/python3, which cannot import the project: neither /work nor the
  project's virtualenv is mounted), and the workspace at /workspace, the only writable host path.
  Extra read-only paths can be bound for a verifier (`ro_binds`). No /home, /root, /work, /run,
  /var, /sys, host /proc or host /tmp.
- Network: an empty network namespace (loopback only). IPC, abstract unix sockets and hostname are
  its own. Host unix sockets (Ray's among them) are not in its file system.
- Processes: pid 1 of its namespace is bwrap's init; when the command exits, is killed at the wall
  deadline, or the caller dies (`--die-with-parent`), the namespace ends and the kernel kills every
  process in it, `setsid`/`nohup` ones included. The episode's cgroup is emptied after each command
  as a second line.
- Limits per process (rlimits): CPU seconds (SIGXCPU), address space, file size (SIGXFSZ; also caps
  the captured output, which goes to a file), open files, no core dumps; the wall clock.
- Limits per episode (`Jail`, one per sandbox): a pids cgroup (fork bombs stop at `max_processes`),
  a memory cgroup (all processes of the episode together, OOM-killed beyond `episode_memory_bytes`),
  a CPU quota (`cpus` cores) and an aggregate CPU budget (`episode_cpu_seconds`, counted by cpuacct;
  commands are refused once it is spent, and each gets at most what is left). Where the cgroup
  hierarchy is not writable, RLIMIT_NPROC stands in for the pids cgroup and the other aggregate
  limits are missing (logged once; `isolation()` says what is in force). Disk: see envs/sandbox.py
  (the workspace is a size- and inode-limited tmpfs where mounting is allowed).

If bwrap is missing or cannot create its namespaces, `JailUnavailable` is raised with what to do;
commands never run unjailed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import logging
import os
import re
import shlex
import shutil
import select
import signal
import subprocess
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

JAIL_UID = JAIL_GID = 65534  # nobody/nogroup: the host uid of jailed commands when the caller is root
WORKDIR = "/workspace"
JAIL_PATH = "/opt/k3/bin:/usr/local/bin:/usr/bin:/bin"
INSTALL_HINT = "install bubblewrap (`apt-get install -y bubblewrap`; `make setup` does this)"


class JailUnavailable(RuntimeError):
    """bubblewrap cannot run here; commands are refused rather than run unjailed."""



def _exits_within(proc: subprocess.Popen, seconds: float) -> bool:
    """Wait for `proc` to exit, at most `seconds`; True if it did. A pidfd wakes the wait the moment
    the process ends (Popen.wait(timeout) polls with sleeps of up to 50 ms, ~30–40 ms lost a command)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd (old kernel): Popen's polling wait
        try:
            proc.wait(timeout=seconds)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        return bool(select.select([fd], [], [], seconds)[0])
    finally:
        os.close(fd)

@dataclass(frozen=True)
class Limits:
    cpu_seconds: int = 10  # per process (RLIMIT_CPU)
    memory_bytes: int = 1 << 30  # per process address space (RLIMIT_AS)
    wall_seconds: float = 20.0  # per command
    file_size_bytes: int = 32 << 20  # per file (RLIMIT_FSIZE)
    open_files: int = 256
    output_chars: int = 20_000
    max_processes: int = 64  # per episode (pids cgroup; RLIMIT_NPROC without one)
    episode_memory_bytes: int = 1536 << 20  # all processes of the episode together (memory cgroup)
    episode_cpu_seconds: float = 300.0  # CPU time of the whole episode (cpuacct)
    cpus: float = 1.0  # CPU quota of the episode's processes (cfs)
    tmp_bytes: int = 64 << 20  # the jail's /tmp (a tmpfs, charged to the episode's memory)
    disk_bytes: int = 256 << 20  # the workspace tmpfs (envs/sandbox.py)
    max_files: int = 20_000  # inodes of the workspace tmpfs


@dataclass(frozen=True)
class CommandResult:
    exit_code: int  # the shell's exit code; 128 + signal number when killed by a signal
    output: str  # stdout and stderr interleaved, truncated to Limits.output_chars
    # "exited" | "cpu_limit" | "wall_limit" | "output_limit" | "memory_limit" | "signal" | "episode_cpu_limit"
    status: str
    wall_seconds: float


# --- bwrap -------------------------------------------------------------------------------------------
def _as_root() -> bool:
    return os.geteuid() == 0


@functools.lru_cache(maxsize=1)
def _jail_python() -> str | None:
    """The interpreter `python` runs inside the jail: the system's, outside any project environment."""
    for p in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(p):
            return p
    return None


def _root_binds() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "lib", "lib64", "lib32", "sbin"):
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), f"/{name}"]
        elif host.is_dir():
            args += ["--ro-bind", str(host), f"/{name}"]
    for p in ("/etc/alternatives", "/etc/ld.so.cache"):
        args += ["--ro-bind-try", p, p]
    return args


Binds = tuple[tuple[str, str], ...]  # (host path, path inside the jail)


def bwrap_argv(limits: Limits, mounts: list[tuple[str, int, str]], env: dict[str, str] | None = None) -> list[str]:
    """The setpriv + bwrap prefix of a command. `mounts` are (bwrap option, open O_PATH fd, path
    inside), e.g. ("--bind-fd", fd, "/workspace"): binding by descriptor means the unprivileged bwrap
    needs no search permission on the host path's parents, and the host path appears nowhere inside
    (not even in /proc/1/cmdline)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise JailUnavailable(f"envs.jail: bwrap not found; {INSTALL_HINT}")
    args = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--hostname", "k3-jail",
            *_root_binds(),
            "--proc", "/proc", "--dev", "/dev",
            "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp",
            "--dir", "/opt/k3/bin"]
    py = _jail_python()
    if py is not None:
        args += ["--symlink", py, "/opt/k3/bin/python", "--symlink", py, "/opt/k3/bin/python3"]
    for option, fd, inside in mounts:
        args += [option, str(fd), inside]
    args += ["--remount-ro", "/", "--chdir", WORKDIR, "--clearenv",
             "--setenv", "PATH", JAIL_PATH, "--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp",
             "--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONDONTWRITEBYTECODE", "1"]
    for key, value in (env or {}).items():
        args += ["--setenv", key, value]
    args.append("--")
    if _as_root():
        # bwrap then runs unprivileged: the jail's processes are host uid 65534 with no capabilities.
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise JailUnavailable("envs.jail: setpriv (util-linux) not found; it drops root before bwrap")
        args = [setpriv, f"--reuid={JAIL_UID}", f"--regid={JAIL_GID}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", *args]
    return args


def _open_mounts(workspace: Path, writable: bool, ro_binds: Binds, rw_binds: Binds) -> list[tuple[str, int, str]]:
    """O_PATH descriptors of every host path the jail binds (closed by the caller)."""
    plan = [("--bind-fd" if writable else "--ro-bind-fd", str(workspace), WORKDIR)]
    plan += [("--ro-bind-fd", h, i) for h, i in ro_binds] + [("--bind-fd", h, i) for h, i in rw_binds]
    mounts = []
    try:
        for option, host, inside in plan:
            mounts.append((option, os.open(host, os.O_PATH | os.O_CLOEXEC), inside))
    except OSError:
        for _, fd, _ in mounts:
            os.close(fd)
        raise
    return mounts


@functools.lru_cache(maxsize=1)
def check_bwrap() -> None:
    """Raise JailUnavailable (with bwrap's own message) unless a jailed `true` runs here."""
    with tempfile.TemporaryDirectory(prefix="k3-jailcheck-") as d:
        if _as_root():
            os.chown(d, JAIL_UID, JAIL_GID)
        mounts = _open_mounts(Path(d), False, (), ())
        try:
            r = subprocess.run([*bwrap_argv(Limits(), mounts), "/bin/sh", "-c", "true"], capture_output=True,
                               timeout=30, env={"PATH": "/usr/bin:/bin"}, pass_fds=[fd for _, fd, _ in mounts])
        except (OSError, subprocess.SubprocessError) as e:
            raise JailUnavailable(f"envs.jail: bwrap could not be started ({e}); {INSTALL_HINT}") from None
        finally:
            for _, fd, _ in mounts:
                os.close(fd)
    if r.returncode != 0:
        raise JailUnavailable(
            "envs.jail: bwrap cannot create its namespaces here "
            f"({r.stderr.decode(errors='replace').strip()}); unprivileged user namespaces must be allowed "
            "(sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0). "
            "Commands are refused rather than run without a sandbox.")
    if _jail_python() is None:
        log.warning("envs.jail: no /usr/bin/python3; `python` is not available inside the jail")


# --- cgroups -----------------------------------------------------------------------------------------
_SEQ = itertools.count()


def _cgroup_roots() -> dict[str, Path]:
    """{controller: directory of this process's cgroup} for the v1 controllers we use, or {"v2": dir}."""
    mounts: dict[str, Path] = {}
    v2 = None
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                dev, mnt, fstype, opts, *_ = line.split()
                if fstype == "cgroup":
                    for c in opts.split(","):
                        if c in ("pids", "memory", "cpu", "cpuacct"):
                            mounts[c] = Path(mnt)
                elif fstype == "cgroup2" and v2 is None:
                    v2 = Path(mnt)
        own: dict[str, str] = {}
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, ctrls, path = line.rstrip("\n").split(":", 2)
                for c in ctrls.split(",") if ctrls else [""]:
                    own[c] = path.lstrip("/")
    except (OSError, ValueError):
        return {}
    if mounts:
        return {c: m / own.get(c, "") for c, m in mounts.items()}
    if v2 is not None:
        return {"v2": v2 / own.get("", "")}
    return {}


_CGROUP_PREFIX = "k3-envs-"
# Episode cgroups and sandbox folders carry their creator in their name: `<pid>.<start>` where
# `start` is the process's start time in clock ticks since boot (/proc/<pid>/stat field 22). A pid
# alone can be reused after its process dies; the pair names one process for the machine's uptime.
_OWNER_RE = re.compile(r"(\d+)(?:\.(\d+))?-")


def _start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The command name (field 2) may hold spaces and parentheses: count from its last ')'.
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def owner_tag() -> str:
    """`<pid>.<start ticks>` of this process: the prefix of every cgroup and folder it creates."""
    return f"{os.getpid()}.{_start_ticks(os.getpid()) or 0}"


def owner_is_dead(rest: str) -> bool:
    """Whether the process named at the start of `rest` (`<pid>.<start>-…`, or an older `<pid>-…`)
    is gone: no such pid, or a pid now held by a process that started at another time. A name that
    names no process is not ours to judge and counts as alive."""
    m = _OWNER_RE.match(rest)
    if m is None:
        return False
    pid = int(m.group(1))
    if pid == os.getpid() and (m.group(2) is None or int(m.group(2)) == _start_ticks(pid)):
        return False
    start = _start_ticks(pid)
    return start is None or (m.group(2) is not None and int(m.group(2)) != start)


def _kill_procs(d: Path) -> None:
    try:
        pids = (d / "cgroup.procs").read_text().split()
    except OSError:
        return
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (OSError, ValueError):
            pass


@functools.lru_cache(maxsize=1)
def _sweep_stale_cgroups(roots: tuple[Path, ...]) -> None:
    """Remove the episode cgroups a killed run left (its creator is dead, by `owner_is_dead`), after
    killing anything still in them; cgroups of live runs and of anyone else stay."""
    for root in roots:
        try:
            stale = [d for d in root.glob(f"{_CGROUP_PREFIX}*") if owner_is_dead(d.name[len(_CGROUP_PREFIX):])]
        except OSError:
            continue
        for d in stale:
            _kill_procs(d)
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)  # the killed processes are still being reaped
            else:
                log.warning("envs.jail: cannot remove the stale episode cgroup %s", d)
        if stale:
            log.info("envs.jail: swept %d episode cgroups of dead runs under %s", len(stale), root)


class EpisodeCgroup:
    """The cgroups of one episode: pids, memory, CPU quota and accounting (v1 or v2)."""

    CONTROLLERS = ("pids", "memory", "cpu", "cpuacct")

    def __init__(self, limits: Limits):
        self.dirs: dict[str, Path] = {}  # controller -> its directory (co-mounted ones share one)
        self.v2 = False
        name = f"{_CGROUP_PREFIX}{owner_tag()}-{next(_SEQ)}"
        try:
            roots = _cgroup_roots()
            _sweep_stale_cgroups(tuple(sorted(set(roots.values()))))
            if "v2" in roots:
                self.v2 = True
                d = roots["v2"] / name
                d.mkdir()
                self.dirs = dict.fromkeys(self.CONTROLLERS, d)
                (d / "pids.max").write_text(str(limits.max_processes))
                (d / "memory.max").write_text(str(limits.episode_memory_bytes))
                (d / "cpu.max").write_text(f"{int(limits.cpus * 100_000)} 100000")
            else:
                missing = [c for c in ("pids", "memory", "cpuacct") if c not in roots]
                if missing:
                    raise OSError(f"no {', '.join(missing)} controller mounted")
                for c in self.CONTROLLERS:
                    if c in roots:
                        d = roots[c] / name
                        if d not in self.dirs.values():
                            d.mkdir()
                        self.dirs[c] = d
                self._write("pids", "pids.max", limits.max_processes)
                self._write("memory", "memory.limit_in_bytes", limits.episode_memory_bytes)
                self._write("memory", "memory.memsw.limit_in_bytes", limits.episode_memory_bytes, optional=True)
                self._write("cpu", "cpu.cfs_period_us", 100_000, optional=True)
                self._write("cpu", "cpu.cfs_quota_us", int(limits.cpus * 100_000), optional=True)
        except OSError as e:
            self.remove()
            _warn_once(f"envs.jail: no writable cgroups ({e}); the episode's pids limit is RLIMIT_NPROC and "
                       "its aggregate memory and CPU limits are not enforced")

    def _write(self, controller: str, file: str, value: int, optional: bool = False) -> None:
        try:
            if controller not in self.dirs:
                raise OSError(f"no {controller} cgroup")
            (self.dirs[controller] / file).write_text(str(value))
        except OSError:
            if not optional:
                raise

    def _read(self, controller: str, file: str) -> str:
        try:
            return (self.dirs[controller] / file).read_text()
        except (OSError, KeyError):
            return ""

    def _unique_dirs(self) -> list[Path]:
        return list(dict.fromkeys(self.dirs.values()))

    @property
    def active(self) -> bool:
        return bool(self.dirs)

    def join_prefix(self) -> list[str]:
        """argv that moves itself into every cgroup of the episode, then execs the rest."""
        if not self.dirs:
            return []
        writes = " && ".join(f"echo $$ > {shlex.quote(str(d / 'cgroup.procs'))}" for d in self._unique_dirs())
        return ["/bin/sh", "-c", f'{writes} && exec "$@"', "k3-jail-join"]

    def cpu_seconds(self) -> float:
        """CPU time used by the episode's processes so far."""
        try:
            if self.v2:
                for line in self._read("cpu", "cpu.stat").splitlines():
                    if line.startswith("usage_usec"):
                        return int(line.split()[1]) / 1e6
                return 0.0
            return int(self._read("cpuacct", "cpuacct.usage") or 0) / 1e9
        except ValueError:
            return 0.0

    def peaks(self) -> dict[str, int]:
        """Most memory (bytes) and processes the episode held at once, where the kernel reports it."""
        out = {}
        for key, controller, file in (("memory_bytes", "memory", "memory.peak" if self.v2 else "memory.max_usage_in_bytes"),
                                      ("processes", "pids", "pids.peak")):
            text = self._read(controller, file).strip()
            if text.isdigit():
                out[key] = int(text)
        return out

    def oom_kills(self) -> int:
        for line in self._read("memory", "memory.events" if self.v2 else "memory.oom_control").splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def kill_all(self, wait: bool = True) -> None:
        """SIGKILL every process left in the episode's cgroups (normally only ones the ended pid
        namespace is already taking down), and with `wait`, until the cgroups are empty."""
        for k in range(200):
            pids = {int(p) for d in self._unique_dirs() for p in self._read_procs(d)}
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            if not wait:
                return
            time.sleep(min(0.001 * 2**k, 0.02))

    @staticmethod
    def _read_procs(d: Path) -> list[str]:
        try:
            return (d / "cgroup.procs").read_text().split()
        except OSError:
            return []

    def remove(self) -> None:
        self.kill_all()
        for d in self._unique_dirs():
            for _ in range(100):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)  # the last processes are still being reaped
        self.dirs = {}


@functools.lru_cache(maxsize=None)
def _warn_once(message: str) -> None:
    log.warning(message)


# --- running -----------------------------------------------------------------------------------------
def _rlimit_argv(limits: Limits, cpu_seconds: int, nproc: bool) -> list[str]:
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        raise JailUnavailable("envs.jail: prlimit (util-linux) not found; it sets the per-process limits")
    opts = [f"--cpu={cpu_seconds}:{cpu_seconds + 1}", f"--as={limits.memory_bytes}",
            f"--fsize={limits.file_size_bytes}", f"--nofile={limits.open_files}", "--core=0"]
    if nproc:
        opts.append(f"--nproc={limits.max_processes}")
    return [prlimit, *opts, "--"]


class Jail:
    """The jail of one episode: its workspace, limits and cgroups. `close()` ends every process."""

    def __init__(self, workspace: Path, limits: Limits = Limits()):
        check_bwrap()
        self.workspace = Path(workspace)
        self.limits = limits
        self.cgroup = EpisodeCgroup(limits)
        # An env dropped without close() still gives its cgroups back.
        self._finalizer = weakref.finalize(self, self.cgroup.remove)

    def run_argv(self, argv: list[str], limits: Limits | None = None, stdin_text: str = "",
                 ro_binds: Binds = (), writable: bool = True, rw_binds: Binds = ()) -> CommandResult:
        """Run argv (no shell) in the jail, with the workspace at /workspace as its cwd (read-only
        unless `writable`), and the extra host paths bound where `ro_binds` / `rw_binds` say."""
        limits = limits or self.limits
        start = time.monotonic()
        cpu_left = limits.episode_cpu_seconds - self.cgroup.cpu_seconds()
        if self.cgroup.active and cpu_left < 0.5:
            return CommandResult(1, f"the episode's CPU budget ({limits.episode_cpu_seconds:g} s) is spent",
                                 "episode_cpu_limit", 0.0)
        cpu = max(1, min(int(limits.cpu_seconds), int(cpu_left)))
        with self.prepare(argv, dataclasses.replace(limits, cpu_seconds=cpu), ro_binds, rw_binds, writable) as (full, fds):
            return self._run(full, limits, stdin_text, fds, start)

    @contextlib.contextmanager
    def prepare(self, argv: list[str], limits: Limits | None = None, ro_binds: Binds = (), rw_binds: Binds = (),
                writable: bool = True, env: dict[str, str] | None = None):
        """(full argv, descriptors to pass) that run argv in this jail, for callers that start the
        process themselves (envs/kernelsuite/sandbox.py); the descriptors are closed on exit."""
        limits = limits or self.limits
        mounts = _open_mounts(self.workspace, writable, ro_binds, rw_binds)
        try:
            full = [*self.cgroup.join_prefix(), *_rlimit_argv(limits, int(limits.cpu_seconds), nproc=not self.cgroup.active),
                    *bwrap_argv(limits, mounts, env), *argv]
            yield full, [fd for _, fd, _ in mounts]
        finally:
            for _, fd, _ in mounts:
                os.close(fd)

    def _run(self, full: list[str], limits: Limits, stdin_text: str, fds: list[int], start: float) -> CommandResult:
        ooms = self.cgroup.oom_kills()
        with tempfile.TemporaryFile(prefix="k3-out-") as out, tempfile.TemporaryFile(prefix="k3-in-") as stdin:
            stdin.write(stdin_text.encode())
            stdin.seek(0)
            proc = subprocess.Popen(full, cwd="/", env={"PATH": "/usr/bin:/bin"}, stdin=stdin,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                                    pass_fds=fds)
            try:
                wall_hit = not _exits_within(proc, limits.wall_seconds)
            finally:
                # bwrap's init dies with it (--die-with-parent) and takes the whole pid namespace along.
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                proc.wait()
                self.cgroup.kill_all(wait=False)
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
        elif self.cgroup.oom_kills() > ooms:
            status = "memory_limit"
        elif code == 128 + signal.SIGXCPU:
            status = "cpu_limit"
        elif code == 128 + signal.SIGXFSZ:
            status = "output_limit"
        elif rc < 0:
            status = "signal"
        else:
            status = "exited"
        return CommandResult(exit_code=code, output=text, status=status, wall_seconds=wall)

    def run_command(self, command: str, limits: Limits | None = None) -> CommandResult:
        """Run a bash command line in the jail."""
        return self.run_argv(["/bin/bash", "--noprofile", "--norc", "-c", command], limits)

    def close(self) -> None:
        self._finalizer()


def isolation() -> dict:
    """What is in force on this machine (for logs, docs and benchmarks)."""
    check_bwrap()
    cg = EpisodeCgroup(Limits())
    try:
        cgroups = sorted(cg.dirs)
    finally:
        cg.remove()
    return {"sandbox": "bwrap", "bwrap": shutil.which("bwrap"),
            "uid": JAIL_UID if _as_root() else os.geteuid(),
            "namespaces": ["user", "mount", "pid", "net", "ipc", "uts", "cgroup"],
            "cgroups": cgroups, "python": _jail_python()}


def run_argv(argv: list[str], cwd: Path, limits: Limits = Limits(), stdin_text: str = "",
             ro_binds: Binds = (), writable: bool = True) -> CommandResult:
    """Run argv in a one-off jail whose workspace is `cwd` (made writable for the jail's uid; its
    parents must be searchable by that uid, which bwrap binds it as)."""
    if _as_root() and writable:
        os.chown(cwd, JAIL_UID, JAIL_GID)
    jail = Jail(Path(cwd), limits)
    try:
        return jail.run_argv(argv, stdin_text=stdin_text, ro_binds=ro_binds, writable=writable)
    finally:
        jail.close()


def run_command(command: str, cwd: Path, limits: Limits = Limits()) -> CommandResult:
    """Run a bash command line in a one-off jail whose workspace is `cwd`."""
    return run_argv(["/bin/bash", "--noprofile", "--norc", "-c", command], cwd, limits)
