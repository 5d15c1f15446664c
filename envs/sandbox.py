"""A directory-backed sandbox: the agent's workspace, file tools confined to it, jailed commands,
and byte snapshots that restore the tree exactly.

Layout on disk: `<root>/workspace/` is what the agent sees (shown as /workspace by harnesses with
absolute paths, and mounted at /workspace for its commands). Where we may mount (as root) the
workspace is its own tmpfs of `Limits.disk_bytes` bytes and `Limits.max_files` inodes, owned by the
jail's uid: the episode's disk use is bounded by the kernel, and no hard link can join it to a file
outside. Everything else the episode needs (app state, counters, the trajectory) is held by the
environment and serialized next to the tree in a snapshot (env.py).

Commands (`run`, `search`) go through envs/jail.py: bubblewrap namespaces, uid 65534, a read-only
minimal root, limits per process and per episode (see its docstring). The real directory never
appears inside; it is also replaced by "/workspace" in the output, so observations are identical
across runs and machines, which pause/resume equality needs.

Confinement rules for the file tools (`resolve`): a path is relative, has no `..` component and no
NUL, and no component of it may be a symlink — so a link planted with a shell command can neither be
read through nor written through.

Whatever a command left in the tree (FIFOs, sockets, trees 10^4 deep, names at the length limit,
files that vanish), `manifest`, `digest`, `pack` and `close` do not raise: the walk is iterative,
every entry is examined with lstat and opened with O_NOFOLLOW | O_NONBLOCK and checked to be a regular
file before it is read, and entries that cannot be read (or lie deeper than MAX_DEPTH, or past
MAX_ENTRIES) are recorded in the manifest as "special" / "unreadable" / "truncated" and left out of
snapshots. `close` removes the directory even when Python's recursive rmtree cannot.

Snapshots (`pack` / `unpack`) are an uncompressed tar with fixed metadata (sorted names, mtime 0,
uid/gid 0), so the same tree always gives the same bytes. Symlinks are stored as links and re-created
last on unpack, after every file has been written, so unpacking never follows one. `unpack` checks
the member count, names, types and total size before writing anything.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import functools
import hashlib
import io
import json
import logging
import os
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path

from envs.jail import JAIL_GID, JAIL_UID, CommandResult, Jail, Limits, check_bwrap, owner_is_dead, owner_tag

log = logging.getLogger(__name__)

WORKDIR = "/workspace"
MAX_FILE_BYTES = 1 << 20
MAX_READ_LINES = 2000
MAX_LINE_CHARS = 2000
MAX_SEARCH_HITS = 200
MAX_DEPTH = 256  # deeper entries are not walked (recorded as "truncated")
MAX_ENTRIES = 100_000  # entries walked per tree
_SANDBOX_PREFIX = "k3-sandbox-"


class SandboxError(Exception):
    """A file operation the sandbox refuses; the message is shown to the policy."""


@dataclass(frozen=True)
class ReadResult:
    lines: list[str]
    first_line: int  # 1-based number of lines[0]
    total_lines: int
    is_dir: bool = False


@functools.lru_cache(maxsize=1)
def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _mount_tmpfs(target: Path, limits: Limits) -> bool:
    """Mount a size- and inode-limited tmpfs owned by the jail's uid at `target` (root only)."""
    if os.geteuid() != 0:
        return False
    opts = f"size={limits.disk_bytes},nr_inodes={limits.max_files},mode=0755,uid={JAIL_UID},gid={JAIL_GID}"
    ms_nosuid, ms_nodev = 2, 4
    if _libc().mount(b"tmpfs", str(target).encode(), b"tmpfs", ms_nosuid | ms_nodev, opts.encode()) != 0:
        log.warning("envs.sandbox: cannot mount a tmpfs workspace (%s); the disk limit is per file only",
                    os.strerror(ctypes.get_errno()))
        return False
    return True


def _unmount(target: str) -> None:
    mnt_detach = 2
    _libc().umount2(target.encode(), mnt_detach)


def remove_tree(path: str) -> None:
    """Remove a directory tree whatever is in it: unmount a workspace tmpfs, then rmtree, then `rm -rf`
    (GNU rm walks any depth; Python's rmtree recurses and fails past about a thousand levels)."""
    ws = os.path.join(path, "workspace")
    if os.path.ismount(ws):
        _unmount(ws)
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return
    except (OSError, RecursionError):
        subprocess.run(["rm", "-rf", "--one-file-system", "--", path], capture_output=True, timeout=120)


@functools.lru_cache(maxsize=1)
def _sweep_stale_sandboxes() -> None:
    """Unmount and remove the sandbox folders a killed run left in the temp directory: those named
    `k3-sandbox-<pid>.<start>-…` (or an older `k3-sandbox-<pid>-…`) whose creator is dead
    (`owner_is_dead`), whether or not their workspace tmpfs is still mounted. Live runs' folders and
    anything not named so stay."""
    tmp = tempfile.gettempdir()
    pat = re.compile(re.escape(tmp) + "/" + _SANDBOX_PREFIX + r"([^/]+)")
    roots: set[str] = set()
    try:
        with open("/proc/self/mounts") as f:
            roots |= {m.group(0) for line in f if (m := pat.match(line.split()[1]))}
    except OSError:
        pass
    try:
        roots |= {os.path.join(tmp, e.name) for e in os.scandir(tmp)
                  if e.name.startswith(_SANDBOX_PREFIX) and e.is_dir(follow_symlinks=False)}
    except OSError:
        pass
    stale = sorted(r for r in roots if owner_is_dead(os.path.basename(r)[len(_SANDBOX_PREFIX):]))
    for root in stale:
        remove_tree(root)
    if stale:
        log.info("envs.sandbox: swept %d sandbox folders of dead runs from %s", len(stale), tmp)


class Sandbox:
    def __init__(self, root: Path | None = None, limits: Limits = Limits()):
        check_bwrap()  # before anything is made: no sandbox without a jail
        _sweep_stale_sandboxes()
        if root is None:
            root = Path(tempfile.mkdtemp(prefix=f"{_SANDBOX_PREFIX}{owner_tag()}-"))
            self._finalizer = weakref.finalize(self, remove_tree, str(root))
            # Searchable, not listable: bwrap, as the jail's uid, must reach <root>/workspace.
            os.chmod(root, 0o711)
        self.root = Path(root)
        self.workspace = self.root / "workspace"
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.limits = limits
        self.own_filesystem = _mount_tmpfs(self.workspace, limits)
        self._own(self.workspace)
        self.jail = Jail(self.workspace, limits)

    def close(self) -> None:
        jail = getattr(self, "jail", None)
        if jail is not None:
            jail.close()
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()
        elif getattr(self, "own_filesystem", False) and os.path.ismount(self.workspace):
            _unmount(str(self.workspace))  # a caller-given root stays, without our tmpfs

    def _own(self, path: Path) -> None:
        """Hand a file or directory the host wrote to the jail's uid, so commands can change it."""
        if os.geteuid() == 0:
            os.lchown(path, JAIL_UID, JAIL_GID)

    # --- path confinement ----------------------------------------------------------------
    def resolve(self, path: str) -> Path:
        """The absolute path of `path` inside the workspace, or SandboxError."""
        if not isinstance(path, str):
            raise SandboxError("the path must be a string")
        if "\x00" in path:
            raise SandboxError("the path contains a NUL character")
        if len(path) > 4096:
            raise SandboxError("the path is too long")
        if path.startswith("/"):
            raise SandboxError(f"{path!r} is outside the workspace; use a path inside it")
        parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
        if ".." in parts:
            raise SandboxError(f"{path!r} contains '..'; paths must stay inside the workspace")
        cur = self.workspace
        for part in parts:
            cur = cur / part
            if cur.is_symlink():
                raise SandboxError(f"{path!r} goes through a symbolic link, which file tools do not follow")
        real_root = os.path.realpath(self.workspace)
        if os.path.commonpath([real_root, os.path.realpath(cur)]) != real_root:
            raise SandboxError(f"{path!r} resolves outside the workspace")
        return cur

    def display(self, abs_path: Path) -> str:
        rel = abs_path.relative_to(self.workspace).as_posix()
        return rel if rel != "." else "."

    # --- file tools ----------------------------------------------------------------------
    def read(self, path: str, offset: int = 1, limit: int | None = None) -> ReadResult:
        p = self.resolve(path)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 1:
            raise SandboxError("offset must be a line number >= 1")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise SandboxError("limit must be a positive number of lines")
        if p.is_dir():
            entries = sorted(e.name + ("/" if e.is_dir() and not e.is_symlink() else "") for e in p.iterdir())
            return ReadResult(entries, 1, len(entries), is_dir=True)
        text = self._read_regular(p, path, "; use search instead")
        lines = text.split("\n")
        if text.endswith("\n"):
            lines.pop()
        if text == "":
            lines = []
        n = min(limit or MAX_READ_LINES, MAX_READ_LINES)
        shown = [ln if len(ln) <= MAX_LINE_CHARS else ln[:MAX_LINE_CHARS] + " [line truncated]"
                 for ln in lines[offset - 1: offset - 1 + n]]
        return ReadResult(shown, offset, len(lines))

    def write(self, path: str, content: str) -> int:
        p = self.resolve(path)
        if not isinstance(content, str):
            raise SandboxError("the content must be a string")
        data = content.encode("utf-8", errors="surrogatepass")
        if len(data) > MAX_FILE_BYTES:
            raise SandboxError(f"the content is larger than {MAX_FILE_BYTES} bytes")
        if p == self.workspace or p.is_dir():
            raise SandboxError(f"{path!r} is a directory")
        parent = p.parent
        if parent.exists() and not parent.is_dir():
            raise SandboxError(f"{self.display(parent)!r} is a file, not a directory")
        try:
            missing = [d for d in [parent, *parent.parents] if not d.exists()]
            parent.mkdir(parents=True, exist_ok=True)
            for d in missing:
                self._own(d)
            # Unlink first: a hard link planted by a command must not let a write reach its other name.
            if p.exists() or p.is_symlink():
                p.unlink()
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            self._own(p)
        except (NotADirectoryError, FileExistsError, IsADirectoryError) as e:
            raise SandboxError(f"cannot write {path!r}: {e.strerror}") from None
        except OSError as e:
            # The workspace's disk or inode limit (ENOSPC), or a name too long for the file system.
            raise SandboxError(f"cannot write {path!r}: {e.strerror}") from None
        return len(data)

    def edit(self, path: str, old: str, new: str, replace_all: bool = False) -> int:
        p = self.resolve(path)
        if not p.is_file() or p.is_symlink():
            raise SandboxError(f"{path!r} does not exist")
        if not old:
            raise SandboxError("the text to replace must not be empty")
        if old == new:
            raise SandboxError("the old and new text are the same; nothing to change")
        text = self.read_text(path)
        count = text.count(old)
        if count == 0:
            raise SandboxError(f"the text to replace was not found in {path!r}")
        if count > 1 and not replace_all:
            raise SandboxError(
                f"the text to replace occurs {count} times in {path!r}; include more context to "
                "make it unique, or replace all occurrences"
            )
        self.write(path, text.replace(old, new) if replace_all else text.replace(old, new, 1))
        return count

    def read_text(self, path: str) -> str:
        return self._read_regular(self.resolve(path), path)

    @staticmethod
    def _read_regular(p: Path, path: str, hint: str = "") -> str:
        """The text of a regular file of at most MAX_FILE_BYTES; never blocks on a FIFO or device."""
        data = _read_file(p, MAX_FILE_BYTES)
        if data is None:
            raise SandboxError(f"{path!r} does not exist or is not a regular file")
        if len(data) > MAX_FILE_BYTES:
            raise SandboxError(f"{path!r} is larger than {MAX_FILE_BYTES} bytes{hint}")
        return data.decode("utf-8", errors="replace")

    def search(self, pattern: str, path: str = ".") -> list[str]:
        """`path:line:text` hits of an extended regex (grep -E), sorted by path and line."""
        p = self.resolve(path)
        if not isinstance(pattern, str) or not pattern or len(pattern) > 1000 or "\x00" in pattern:
            raise SandboxError("the pattern must be a non-empty string of at most 1000 characters")
        if not p.exists():
            raise SandboxError(f"{path!r} does not exist")
        rel = self.display(p)
        # GNU grep -E is automaton-based, so a hostile pattern cannot backtrack for minutes; it still
        # runs inside the jail with the wall-clock limit.
        res = self.jail.run_argv(
            ["grep", "-rnIED", "skip", "--null", "-e", pattern, "--", rel],
            dataclasses.replace(self.limits, cpu_seconds=5, wall_seconds=10, output_chars=200_000),
        )
        if res.exit_code == 1:
            return []
        if res.exit_code != 0:
            msg = res.output.strip().replace("grep: ", "") or res.status
            raise SandboxError(f"search failed: {msg}")
        hits = []
        for line in res.output.split("\n"):
            if "\x00" not in line:
                continue
            name, rest = line.split("\x00", 1)
            num, _, txt = rest.partition(":")
            if not num.isdigit():
                continue
            name = name[2:] if name.startswith("./") else name
            hits.append((name, int(num), txt[:MAX_LINE_CHARS]))
        hits.sort()
        return [f"{n}:{k}:{t}" for n, k, t in hits]

    def run(self, command: str, timeout: int | None = None) -> CommandResult:
        limits = self.limits
        if timeout is not None:
            limits = dataclasses.replace(limits, wall_seconds=min(float(timeout), limits.wall_seconds))
        result = self.jail.run_command(command, limits)
        real = str(self.workspace)
        output = result.output.replace(os.path.realpath(real), WORKDIR).replace(real, WORKDIR)
        return dataclasses.replace(result, output=output)

    # --- state -----------------------------------------------------------------------------
    def _walk(self):
        """(relative posix path, absolute path, lstat result or None) of every entry, sorted, without
        following links; iterative, depth- and count-limited, and silent about entries that vanish or
        cannot be listed (they come back with st None)."""
        stack = [("", str(self.workspace), 0)]
        count = 0
        while stack:
            rel_dir, abs_dir, depth = stack.pop()
            try:
                with os.scandir(abs_dir) as it:
                    names = sorted(e.name for e in it)
            except OSError:
                continue
            subdirs = []
            for name in names:
                count += 1
                if count > MAX_ENTRIES:
                    yield f"{rel_dir}{name}", None, "truncated"
                    return
                rel, full = f"{rel_dir}{name}", os.path.join(abs_dir, name)
                try:
                    st = os.lstat(full)
                except OSError:
                    yield rel, full, None
                    continue
                yield rel, full, st
                if stat.S_ISDIR(st.st_mode):
                    if depth + 1 >= MAX_DEPTH:
                        yield f"{rel}/", None, "truncated"
                    else:
                        subdirs.append((f"{rel}/", full, depth + 1))
            # Reversed onto the stack so the first subdirectory is walked next: sorted pre-order.
            stack.extend(reversed(subdirs))

    def manifest(self) -> dict[str, dict]:
        """{path: {"type", "sha256"/"target", "mode"}} for the whole workspace."""
        out = {}
        for rel, full, st in self._walk():
            if isinstance(st, str):
                out[rel] = {"type": st}
            elif st is None:
                out[rel] = {"type": "unreadable"}
            elif stat.S_ISLNK(st.st_mode):
                out[rel] = {"type": "symlink", "target": _readlink(full)}
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = {"type": "dir", "mode": st.st_mode & 0o777}
            elif stat.S_ISREG(st.st_mode):
                data = _read_file(full, self.limits.file_size_bytes)
                out[rel] = ({"type": "unreadable"} if data is None else
                            {"type": "file", "sha256": hashlib.sha256(data).hexdigest(), "mode": st.st_mode & 0o777})
            else:
                out[rel] = {"type": "special", "mode": stat.S_IFMT(st.st_mode)}
        return out

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.manifest(), sort_keys=True).encode()).hexdigest()

    def pack(self) -> bytes:
        """The tree as a deterministic tar of its files, directories and symlinks (special files,
        unreadable and truncated entries are left out; the manifest records them)."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for rel, full, st in self._walk():
                if st is None or isinstance(st, str):
                    continue
                info = tarfile.TarInfo(rel)
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                info.mode = st.st_mode & 0o777
                if stat.S_ISLNK(st.st_mode):
                    target = _readlink(full)
                    if target is not None:
                        info.type, info.linkname = tarfile.SYMTYPE, target
                        tar.addfile(info)
                elif stat.S_ISDIR(st.st_mode):
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                elif stat.S_ISREG(st.st_mode):
                    data = _read_file(full, self.limits.file_size_bytes)
                    if data is not None:
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))
        return buf.getvalue()

    def clear(self) -> None:
        """Empty the workspace (it may be a mount point, so the directory itself stays)."""
        for name in os.listdir(self.workspace):
            full = self.workspace / name
            if full.is_dir() and not full.is_symlink():
                remove_tree(str(full))
            else:
                full.unlink()

    def unpack(self, blob: bytes) -> None:
        """Replace the workspace with the tree in `blob` (from `pack`); ValueError, before anything
        is written, for a tar that `pack` could not have made or that exceeds the episode's limits."""
        members = _checked_members(blob, self.limits)
        self.clear()
        links = []
        dir_modes = []
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
            for m in members:
                dest = self.workspace.joinpath(*m.name.split("/"))
                if m.issym():
                    links.append((dest, m.linkname))
                    continue
                # Members come parent directory first (checked), so one mkdir per directory suffices.
                if m.isdir():
                    dest.mkdir()
                    self._own(dest)
                    dir_modes.append((dest, m.mode))
                else:
                    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                    with os.fdopen(fd, "wb") as f:
                        f.write(tar.extractfile(m).read())
                    os.chmod(dest, m.mode & 0o777)
                    self._own(dest)
        for dest, target in links:
            os.symlink(target, dest)
            self._own(dest)
        for dest, mode in dir_modes:
            os.chmod(dest, mode & 0o777)


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def _read_file(path, limit: int) -> bytes | None:
    """Up to limit + 1 bytes of a regular file, opened without following a link or blocking on a
    FIFO; None if it is not a regular file or cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _checked_members(blob: bytes, limits: Limits) -> list[tarfile.TarInfo]:
    """The members of a workspace tar after checking what `pack` guarantees: plain relative names of
    at most MAX_DEPTH parts under directory members, only files, directories and symlinks, each name
    once, at most MAX_ENTRIES members and `limits.disk_bytes` bytes of content."""
    members: list[tarfile.TarInfo] = []
    seen: set[str] = set()
    dirs: set[str] = set()
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
            for m in tar:
                members.append(m)
                if len(members) > MAX_ENTRIES:
                    raise ValueError(f"more than {MAX_ENTRIES} members")
                parts = m.name.split("/")
                if m.name.startswith("/") or ".." in parts or "" in parts or "." in parts or "\x00" in m.name \
                        or len(parts) > MAX_DEPTH or m.name in seen:
                    raise ValueError(f"member {m.name[:100]!r} is not a plain relative path seen once")
                if not (m.isfile() or m.isdir() or m.issym()):
                    raise ValueError(f"member {m.name[:100]!r} is not a file, directory or symlink")
                parent = m.name.rpartition("/")[0]
                if parent and parent not in dirs:
                    raise ValueError(f"member {m.name[:100]!r} comes before (or without) its directory")
                seen.add(m.name)
                if m.isdir():
                    dirs.add(m.name)
                total += m.size if m.isfile() else 0
                if total > limits.disk_bytes:
                    raise ValueError(f"more than {limits.disk_bytes} bytes of files")
    except (tarfile.TarError, OSError, EOFError, UnicodeError) as e:
        raise ValueError(f"not a workspace tar ({type(e).__name__}: {e})") from None
    return members
