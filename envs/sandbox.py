"""A directory-backed sandbox: the agent's workspace, file tools confined to it, jailed commands,
and byte snapshots that restore the tree exactly.

Layout on disk: `<root>/workspace/` is what the agent sees (shown as /workspace by harnesses with
absolute paths). Everything else the episode needs (app state, counters, the trajectory) is held by
the environment and serialized next to the tree in a snapshot (env.py).

Commands see the workspace as /workspace, the name the harnesses show: in a command line, the text
"/workspace" is replaced by the real directory before it runs, and the real directory is replaced
by "/workspace" in the output. That keeps observations identical across runs and machines (the real
directory is a fresh temporary one), which pause/resume equality needs.

Confinement rules for the file tools (`resolve`): a path is relative, has no `..` component and no
NUL, and no component of it may be a symlink — so a link planted with a shell command can neither be
read through nor written through. Commands (`run`) go through envs/jail.py; they are limited but not
chrooted (see its docstring).

Snapshots (`pack` / `unpack`) are an uncompressed tar with fixed metadata (sorted names, mtime 0,
uid/gid 0), so the same tree always gives the same bytes. Symlinks are stored as links and re-created
last on unpack, after every file has been written, so unpacking never follows one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path

from envs.jail import CommandResult, Limits, run_argv, run_command

WORKDIR = "/workspace"
MAX_FILE_BYTES = 1 << 20
MAX_READ_LINES = 2000
MAX_LINE_CHARS = 2000
MAX_SEARCH_HITS = 200


class SandboxError(Exception):
    """A file operation the sandbox refuses; the message is shown to the policy."""


@dataclass(frozen=True)
class ReadResult:
    lines: list[str]
    first_line: int  # 1-based number of lines[0]
    total_lines: int
    is_dir: bool = False


class Sandbox:
    def __init__(self, root: Path | None = None, limits: Limits = Limits()):
        if root is None:
            root = Path(tempfile.mkdtemp(prefix="k3-sandbox-"))
            self._finalizer = weakref.finalize(self, shutil.rmtree, str(root), True)
        self.root = Path(root)
        self.workspace = self.root / "workspace"
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.limits = limits

    def close(self) -> None:
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()

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
        if not p.is_file():
            raise SandboxError(f"{path!r} does not exist")
        if p.stat().st_size > MAX_FILE_BYTES:
            raise SandboxError(f"{path!r} is larger than {MAX_FILE_BYTES} bytes; use search instead")
        text = p.read_bytes().decode("utf-8", errors="replace")
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
            parent.mkdir(parents=True, exist_ok=True)
            # Unlink first: a hard link planted by a command must not let a write reach its other name.
            if p.exists() or p.is_symlink():
                p.unlink()
            p.write_bytes(data)
        except (NotADirectoryError, FileExistsError) as e:
            raise SandboxError(f"cannot write {path!r}: {e.strerror}") from None
        return len(data)

    def edit(self, path: str, old: str, new: str, replace_all: bool = False) -> int:
        p = self.resolve(path)
        if not p.is_file():
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
        p = self.resolve(path)
        if not p.is_file():
            raise SandboxError(f"{path!r} does not exist")
        if p.stat().st_size > MAX_FILE_BYTES:
            raise SandboxError(f"{path!r} is larger than {MAX_FILE_BYTES} bytes")
        return p.read_bytes().decode("utf-8", errors="replace")

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
        res = run_argv(
            ["grep", "-rnIE", "--null", "-e", pattern, "--", rel],
            self.workspace,
            Limits(cpu_seconds=5, wall_seconds=10, output_chars=200_000),
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
            limits = Limits(
                cpu_seconds=limits.cpu_seconds, memory_bytes=limits.memory_bytes,
                wall_seconds=min(float(timeout), limits.wall_seconds),
                file_size_bytes=limits.file_size_bytes, open_files=limits.open_files,
                output_chars=limits.output_chars,
            )
        real = str(self.workspace)
        result = run_command(command.replace(WORKDIR, real), self.workspace, limits)
        output = result.output.replace(os.path.realpath(real), WORKDIR).replace(real, WORKDIR)
        return dataclasses.replace(result, output=output)

    # --- state -----------------------------------------------------------------------------
    def _walk(self):
        """(relative posix path, absolute path) of every entry, sorted, without following links."""
        for dirpath, dirnames, filenames in os.walk(self.workspace, followlinks=False):
            dirnames.sort()
            base = Path(dirpath)
            for name in sorted(dirnames + filenames):
                full = base / name
                yield full.relative_to(self.workspace).as_posix(), full

    def manifest(self) -> dict[str, dict]:
        """{path: {"type", "sha256"/"target", "mode"}} for the whole workspace."""
        out = {}
        for rel, full in self._walk():
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = {"type": "symlink", "target": os.readlink(full)}
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = {"type": "dir", "mode": st.st_mode & 0o777}
            elif stat.S_ISREG(st.st_mode):
                digest = hashlib.sha256(full.read_bytes()).hexdigest()
                out[rel] = {"type": "file", "sha256": digest, "mode": st.st_mode & 0o777}
        return out

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.manifest(), sort_keys=True).encode()).hexdigest()

    def pack(self) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for rel, full in self._walk():
                st = os.lstat(full)
                info = tarfile.TarInfo(rel)
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                info.mode = st.st_mode & 0o777
                if stat.S_ISLNK(st.st_mode):
                    info.type, info.linkname = tarfile.SYMTYPE, os.readlink(full)
                    tar.addfile(info)
                elif stat.S_ISDIR(st.st_mode):
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                elif stat.S_ISREG(st.st_mode):
                    data = full.read_bytes()
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        return buf.getvalue()

    def unpack(self, blob: bytes) -> None:
        """Replace the workspace with the tree in `blob` (from `pack`)."""
        shutil.rmtree(self.workspace)
        self.workspace.mkdir()
        links = []
        dir_modes = []
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
            for m in tar.getmembers():
                parts = m.name.split("/")
                if m.name.startswith("/") or ".." in parts or "" in parts:
                    raise ValueError(f"snapshot member {m.name!r} is not a plain relative path")
                dest = self.workspace.joinpath(*parts)
                if m.issym():
                    links.append((dest, m.linkname))
                elif m.isdir():
                    dest.mkdir(parents=True, exist_ok=True)
                    dir_modes.append((dest, m.mode))
                elif m.isfile():
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                    with os.fdopen(fd, "wb") as f:
                        f.write(tar.extractfile(m).read())
                    os.chmod(dest, m.mode)
        for dest, target in links:
            os.symlink(target, dest)
        for dest, mode in dir_modes:
            os.chmod(dest, mode)
