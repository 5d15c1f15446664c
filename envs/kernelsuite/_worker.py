"""The sandboxed side of the kernel suite: loads one submission and runs it on inputs the parent sends.

This file is run as a script (`python -I _worker.py ...`), never imported by a submission, and imports
only the standard library and torch (triton when installed), so it works in a fresh interpreter whose
`sys.path` does not contain the project. The parent (`sandbox.py`) imports it only for the message
framing below.

Protocol (research/environments.md §1.5, rule P1). The parent creates two pipes, writes a random
32-byte token on the first, then framed messages:

    frame = b"KSW1" | u64 length | HMAC-SHA256(token, payload) | payload (torch.save bytes)

Payloads are loaded with `torch.load(weights_only=True)`, so a forged reply cannot run code in the
parent, and a reply without the right MAC is a forgery (the token lives only in this process's locals).
The parent never sends expected outputs: it computes the reference itself and compares what comes back.

Session: job → "ready" → { stage | run | fetch }* → done → `os._exit(0)` (atexit handlers of the
submission never run). Everything the detector needs from inside the process is gathered here:

    D2  memory is poisoned before each checked call: on the CPU through glibc's MALLOC_PERTURB_ (every
        allocation starts as bytes 0x7F, set by the parent in the environment); on a GPU by filling and
        freeing a large block so the caching allocator hands out 0x7F bytes.
    D3  sha256 of every input after the call (the parent hashed the same bytes before sending).
    D4  `type(out) is torch.Tensor` checked before anything else touches the object (a subclass can
        run code on any attribute access), plus the storage size, strides and dtype.
    D6  identities of the timers and of the functions this worker itself uses, saved before the
        submission loads and compared after every phase; a counter on thread creation; no tracer.
    P1  an audit hook (PEP 578) that records file access outside the allowed roots, gc/frame
        introspection, process/socket/ctypes use and imports of the evaluator's own package, when
        the submission's own code asked for it.
    T1  per-call host time (saved perf_counter, device-wide sync) and, on a GPU, CUDA-event time.
"""

from __future__ import annotations

import _thread
import hashlib
import hmac
import importlib.util
import io
import os
import select
import struct
import sys
import threading
import time
import traceback

MAGIC = b"KSW1"
HEADER = struct.Struct(">4sQ")
TOKEN_BYTES = 32
MAX_MESSAGE_BYTES = 1 << 31
# The byte every fresh allocation is filled with (MALLOC_PERTURB_=128 fills with ~128 = 0x7F). As fp32
# it reads 3.39e38, as fp16 a NaN: a value no honest output contains.
POISON_BYTE = 0x7F
MALLOC_PERTURB = 0xFF ^ POISON_BYTE


class ChannelError(RuntimeError):
    """A frame that is truncated, too large, or carries the wrong MAC."""


# --- framing (shared with the parent) ---------------------------------------------------------------

def _dumps(obj) -> bytes:
    import torch

    buf = io.BytesIO()
    _SAVED.get("torch.save", torch.save)(obj, buf)
    return buf.getvalue()


def _loads(payload: bytes):
    import torch

    return torch.load(io.BytesIO(payload), weights_only=True)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def read_exact(fd: int, n: int, deadline: float | None = None) -> bytes:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the worker did not answer in time")
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                raise TimeoutError("the worker did not answer in time")
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the channel")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def send_message(fd: int, token: bytes, obj) -> None:
    payload = _dumps(obj)
    mac = hmac.new(token, payload, hashlib.sha256).digest()
    write_all(fd, HEADER.pack(MAGIC, len(payload)) + mac + payload)


def recv_message(fd: int, token: bytes, deadline: float | None = None):
    magic, length = HEADER.unpack(read_exact(fd, HEADER.size, deadline))
    if magic != MAGIC or length > MAX_MESSAGE_BYTES:
        raise ChannelError(f"bad frame header (magic {magic!r}, length {length})")
    mac = read_exact(fd, 32, deadline)
    payload = read_exact(fd, length, deadline)
    if not hmac.compare_digest(mac, hmac.new(token, payload, hashlib.sha256).digest()):
        raise ChannelError("a message carries the wrong MAC: it was not written by the evaluator")
    return _loads(payload)


# --- the guard: what the submission may not change (D6) and may not do (P1) ------------------------

_SAVED: dict = {}

_TIMER_ATTRS = {
    "time": ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns",
             "process_time", "sleep"),
    "torch": ("save", "load", "manual_seed", "equal", "allclose", "empty", "no_grad"),
    "torch.Tensor": ("clone", "detach", "cpu", "to", "contiguous", "__eq__", "numpy", "view",
                     "untyped_storage", "is_contiguous", "stride"),
    "torch.nn.Module": ("__call__", "to"),
    "torch.cuda": ("synchronize", "Event", "current_stream", "Stream", "empty_cache"),
    "torch.cuda.Event": ("record", "elapsed_time", "synchronize", "query"),
    "triton.testing": ("do_bench", "do_bench_cudagraph"),
    "hashlib": ("sha256",),
    "builtins": ("open", "__import__", "isinstance", "type", "len", "print", "id", "hash"),
    "threading": ("active_count", "enumerate", "Thread"),
}

# Audit events and how they are attributed to the submission: "direct" when the submission's own code
# is the immediate caller, "first" when it is the first frame outside the standard library (so
# `pathlib.Path.read_text` called by the submission counts, torch's own file reads do not), "frames"
# like "first" but not through warnings/logging, which read frames for every message.
_WATCH = {
    "exec": "direct", "compile": "direct", "sys._getframe": "frames", "sys._current_frames": "first",
    "gc.get_objects": "first", "gc.get_referrers": "first", "gc.get_referents": "first",
    "open": "first", "os.listdir": "first", "os.scandir": "first", "os.remove": "first",
    "os.rename": "first", "os.rmdir": "first", "os.mkdir": "first", "os.chmod": "first",
    "os.truncate": "first", "os.symlink": "first", "os.link": "first", "shutil.rmtree": "first",
    "shutil.copyfile": "first", "subprocess.Popen": "first", "os.system": "first", "os.exec": "first",
    "os.posix_spawn": "first", "os.spawn": "first", "os.fork": "first", "os.forkpty": "first",
    "os.kill": "first", "os.killpg": "first", "os.putenv": "first", "os.unsetenv": "first",
    "socket.__new__": "first", "socket.connect": "first", "socket.bind": "first",
    "ctypes.dlopen": "first", "ctypes.dlsym": "first", "ctypes.addressof": "first",
    "ctypes.cdata": "first", "ctypes.string_at": "first", "ctypes.call_function": "first",
    "sys.settrace": "first", "sys.setprofile": "first", "sys.addaudithook": "first",
    "mmap.__new__": "first", "resource.setrlimit": "first", "import": "first",
}


def _resolve(dotted: str):
    obj = sys.modules.get(dotted.split(".")[0])
    for part in dotted.split(".")[1:]:
        if obj is None:
            return None
        obj = getattr(obj, part, None)
    return obj


class Guard:
    """Saved originals, a thread counter and an audit hook, armed before the submission is loaded."""

    def __init__(self, submission_path: str, workdir: str, protected_roots: list[str],
                 forbidden_imports: list[str]):
        self.submission_path = os.path.realpath(submission_path)
        self.forbidden_imports = set(forbidden_imports)
        self.workdir = os.path.realpath(workdir)
        self.protected = [os.path.realpath(p) for p in protected_roots]
        stdlib = os.path.dirname(os.__file__)
        self.stdlib = os.path.realpath(stdlib)
        roots = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, self.workdir,
                 "/usr/lib", "/usr/share", "/lib", "/lib64", "/usr/local/lib"}
        for path in sys.path:
            if path and ("site-packages" in path or "dist-packages" in path):
                roots.add(path)
        self.read_roots = sorted(os.path.realpath(r) for r in roots if r)
        self.events: list[dict] = []
        self.violations: list[str] = []
        self.threads_started = 0
        self._busy = False
        self._originals: dict[tuple[str, str], object] = {}
        self._baseline_threads = threading.active_count()
        self._baseline_meta_path = len(sys.meta_path)

    def arm(self) -> None:
        for owner, names in _TIMER_ATTRS.items():
            obj = _resolve(owner)
            if obj is None:
                continue
            for name in names:
                if hasattr(obj, name):
                    self._originals[(owner, name)] = getattr(obj, name)
        self._wrap_thread_starts()
        for (owner, name), value in self._originals.items():
            _SAVED[f"{owner}.{name}"] = value
        sys.addaudithook(self._hook)

    def _wrap_thread_starts(self) -> None:
        guard = self

        def counting(start):
            def start_thread(*args, **kwargs):
                guard.threads_started += 1
                return start(*args, **kwargs)
            return start_thread

        for module, names in ((threading, ("_start_new_thread", "_start_joinable_thread")),
                              (_thread, ("start_new_thread", "start_new", "start_joinable_thread"))):
            for name in names:
                if hasattr(module, name):
                    wrapped = counting(getattr(module, name))
                    setattr(module, name, wrapped)
                    self._originals[(module.__name__, name)] = wrapped

    # The hook runs for every audit event in the process, so it returns at once for unwatched ones.
    def _hook(self, event: str, args) -> None:
        mode = _WATCH.get(event)
        if mode is None or self._busy or len(self.events) >= 50:
            return
        if event == "import" and str(args[0]).split(".")[0] not in self.forbidden_imports:
            return
        self._busy = True
        try:
            frame = sys._getframe(1)
            line = self._attributed_line(frame, mode)
            if line is None and event == "open" and self._touches_protected(args, frame):
                line = self._submission_line_anywhere(frame)
            if line is None:
                return
            if event == "open" and not self._open_is_suspicious(args):
                return
            if event in ("os.listdir", "os.scandir") and self._path_allowed(args[0] if args else "."):
                return
            self.events.append({"event": event, "line": line, "detail": repr(args)[:160]})
        finally:
            self._busy = False

    def _is_stdlib(self, filename: str) -> bool:
        if filename.startswith("<frozen"):
            return True
        return filename.startswith(self.stdlib) and "-packages" not in filename

    def _attributed_line(self, frame, mode: str):
        if mode == "direct":
            return frame.f_lineno if frame.f_code.co_filename == self.submission_path else None
        while frame is not None and self._is_stdlib(frame.f_code.co_filename):
            # warnings.warn and logging look at frames for every message: not the submission's doing.
            if mode == "frames" and frame.f_code.co_filename.endswith(("warnings.py", "__init__.py")):
                return None
            frame = frame.f_back
        if frame is not None and frame.f_code.co_filename == self.submission_path:
            return frame.f_lineno
        return None

    def _submission_line_anywhere(self, frame):
        while frame is not None:
            if frame.f_code.co_filename == self.submission_path:
                return frame.f_lineno
            frame = frame.f_back
        return None

    def _path_of(self, raw) -> str | None:
        if isinstance(raw, int):
            return None
        if isinstance(raw, bytes):
            raw = raw.decode(errors="replace")
        return os.path.realpath(os.path.join(self.workdir, str(raw)))

    def _touches_protected(self, args, frame) -> bool:
        path = self._path_of(args[0]) if args else None
        if path is None or not any(path.startswith(p) for p in self.protected):
            return False
        return self._submission_line_anywhere(frame) is not None

    def _path_allowed(self, raw) -> bool:
        path = self._path_of(raw)
        if path is None:
            return True
        if any(path.startswith(p) for p in self.protected):
            return False
        return any(path == r or path.startswith(r + os.sep) for r in self.read_roots)

    def _open_is_suspicious(self, args) -> bool:
        path = self._path_of(args[0]) if args else None
        if path is None:
            return True
        if any(path.startswith(p) for p in self.protected):
            return True
        mode = args[1] if len(args) > 1 and isinstance(args[1], str) else "r"
        flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
        writes = any(c in mode for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
        if writes:
            return not path.startswith(self.workdir + os.sep)
        return not self._path_allowed(path)

    def check(self) -> list[str]:
        """Record every saved attribute that no longer is what it was (D6); return the new ones."""
        found = []
        for (owner, name), value in self._originals.items():
            obj = _resolve(owner)
            if obj is None or getattr(obj, name, None) is not value:
                found.append(f"{owner}.{name} was replaced")
        if threading.active_count() != self._baseline_threads:
            found.append(f"{threading.active_count() - self._baseline_threads} extra thread(s) alive")
        if self.threads_started:
            found.append(f"{self.threads_started} thread(s) started")
        if sys.gettrace() is not None or sys.getprofile() is not None:
            found.append("a trace or profile function is installed")
        if len(sys.meta_path) != self._baseline_meta_path:
            found.append("sys.meta_path was changed (import hook)")
        new = [v for v in found if v not in self.violations]
        self.violations.extend(new)
        return new

    def report(self) -> dict:
        self.check()
        return {"violations": list(self.violations), "events": list(self.events),
                "threads_started": self.threads_started}


# --- running the submission --------------------------------------------------------------------------

def _sync(device) -> None:
    if device.type == "cuda":
        _SAVED["torch.cuda.synchronize"]()


def _poison(torch, device, block_bytes: int, total_bytes: int) -> None:
    """Fill and free blocks so that the next allocations start as POISON_BYTE (D2, GPU path).

    The blocks have the size of the expected output: the caching allocator keeps separate pools for
    small (<= 1 MiB) and large requests and reuses a freed block of the right size first.
    """
    if device.type != "cuda" or block_bytes <= 0:
        return
    count = max(1, min(64, total_bytes // block_bytes))
    blocks = [torch.empty(block_bytes, dtype=torch.uint8, device=device) for _ in range(count)]
    for block in blocks:
        block.fill_(POISON_BYTE)
    del blocks, block


def _snapshot(torch, out):
    """Copy an output out of the submission's hands, checking its type before touching it (D4)."""
    kind = type(out)
    if kind is torch.Tensor:
        clone = _SAVED["torch.Tensor.clone"]
        meta = {
            "dtype": str(out.dtype), "device": out.device.type, "shape": list(out.shape),
            "stride": list(out.stride()), "contiguous": bool(out.is_contiguous()),
            "storage_bytes": int(out.untyped_storage().nbytes()),
            "span_bytes": _span_bytes(out),
        }
        data = clone(out.detach()).contiguous().cpu()
        return {"kind": "tensor", "meta": meta, "data": data}
    if kind in (tuple, list):
        return {"kind": "seq", "items": [_snapshot(torch, item) for item in out]}
    if kind in (int, float, bool):
        return {"kind": "scalar", "value": out}
    return {"kind": "bad", "type": f"{kind.__module__}.{kind.__qualname__}"}


def _span_bytes(t) -> int:
    """Bytes a tensor's elements reach into its storage; a stride-0 view reaches fewer than it claims."""
    if t.numel() == 0:
        return 0
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return int((t.storage_offset() + last + 1) * t.element_size())


def _hash_inputs(torch, args) -> list[str]:
    digests = []
    for arg in args:
        if isinstance(arg, torch.Tensor):
            flat = arg.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
            digests.append(hashlib.sha256(flat.numpy().tobytes()).hexdigest())
        else:
            digests.append(hashlib.sha256(repr(arg).encode()).hexdigest())
    return digests


def _load_submission(path: str):
    spec = importlib.util.spec_from_file_location("submission", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["submission"] = module
    spec.loader.exec_module(module)
    return module


def _to_device(torch, value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    return value


def run_session(fd_in: int, fd_out: int) -> int:
    token = read_exact(fd_in, TOKEN_BYTES)
    job = recv_message(fd_in, token)
    workdir = job["workdir"]
    os.chdir(workdir)
    for key, value in job["env"].items():
        os.environ[key] = value
    import torch

    torch.set_num_threads(int(job["num_threads"]))
    device = torch.device(job["device"])
    if job["preload_triton"]:
        import triton  # noqa: F401  (imported before the snapshot so its timers are saved too)
        import triton.testing  # noqa: F401
    path = os.path.join(workdir, "submission.py")
    with open(path, "w") as f:
        f.write(job["source"])
    guard = Guard(path, workdir, job["protected_roots"], job["forbidden_imports"])
    guard.arm()
    clock = _SAVED["time.perf_counter"]
    send = lambda obj: send_message(fd_out, token, obj)  # noqa: E731

    def fail(phase: str, **extra) -> None:
        send({"kind": "error", "phase": phase, "error": traceback.format_exc(limit=8)[-4000:],
              "guard": guard.report(), **extra})

    torch.set_grad_enabled(False)
    try:
        module = _load_submission(path)
        if not hasattr(module, "ModelNew"):
            raise AttributeError("the submission defines no ModelNew")
        torch.manual_seed(int(job["init_seed"]))
        model = module.ModelNew(*job["init_inputs"])
        if isinstance(model, torch.nn.Module):
            model = _SAVED["torch.nn.Module.to"](model, device)
    except BaseException:  # the submission may raise anything, SystemExit included
        fail("load")
        return 0
    send({"kind": "ready", "guard": guard.report()})

    staged: list[list] = []
    kept: dict[int, dict] = {}
    hashes: dict[int, list[str]] = {}
    timed = False
    use_events = device.type == "cuda"
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=device) if use_events else None
    while True:
        cmd = recv_message(fd_in, token)
        op = cmd["cmd"]
        if op == "stage":
            staged = [[_to_device(torch, v, device) for v in s] for s in cmd["sets"]]
            send({"kind": "staged", "n": len(staged)})
        elif op == "run":
            timed, keep = bool(cmd["timed"]), set(cmd["keep"])
            host, event = [], []
            kept, hashes = {}, {}
            poison_block, poison_total = int(cmd["poison_block"]), int(cmd["poison_total"])
            t_loop = clock()
            pos = -1
            try:
                for pos, idx in enumerate(cmd["order"]):
                    args = staged[idx]
                    if timed and flush is not None:
                        flush.zero_()
                    elif not timed:
                        _poison(torch, device, poison_block, poison_total)
                    _sync(device)
                    if use_events:
                        start = _SAVED["torch.cuda.Event"](enable_timing=True)
                        end = _SAVED["torch.cuda.Event"](enable_timing=True)
                        _SAVED["torch.cuda.Event.record"](start)
                    t0 = clock()
                    out = model(*args)
                    if use_events:
                        _SAVED["torch.cuda.Event.record"](end)
                    _sync(device)
                    t1 = clock()
                    host.append(t1 - t0)
                    if use_events:
                        event.append(_SAVED["torch.cuda.Event.elapsed_time"](start, end) / 1e3)
                    if pos in keep:
                        kept[pos] = _snapshot(torch, out)
                        if not timed:
                            hashes[pos] = _hash_inputs(torch, args)
                    del out
            except BaseException:
                fail("run", position=pos)
                continue
            loop_s = clock() - t_loop
            guard.check()
            send({"kind": "ran", "host": host, "event": event, "loop_s": loop_s,
                  "guard": guard.report()})
        elif op == "fetch":
            # Timed runs hash their inputs only now, so that hashing stays out of the timed loop.
            if timed:
                hashes = {-1 - i: _hash_inputs(torch, s) for i, s in enumerate(staged)}
            send({"kind": "outputs", "outputs": kept, "hashes": hashes})
            kept, hashes = {}, {}
        elif op == "done":
            send({"kind": "done", "guard": guard.report()})
            return 0
        else:
            raise ChannelError(f"unknown command {op!r}")


# --- process entry points ----------------------------------------------------------------------------

def _session_main(fd_in: int, fd_out: int) -> None:
    code = 1
    try:
        code = run_session(fd_in, fd_out)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # Ends here, whatever the submission registered with atexit or left running in threads.
        os._exit(code)


def _zygote_main(ctl_fd: int) -> None:
    """Import torch once, then fork one fresh child per evaluation (the parent's `isolation="zygote"`).

    The zygote never loads a submission, never touches CUDA and never runs a torch op, so each child
    starts from the same clean state a fresh interpreter would have after `import torch`.
    """
    import signal
    import socket

    import torch  # noqa: F401

    if os.environ.get("KERNELSUITE_PRELOAD_TRITON") == "1":
        import triton  # noqa: F401
        import triton.testing  # noqa: F401
    sock = socket.socket(fileno=ctl_fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Not dumpable: a child running a submission (same uid) cannot ptrace or read the zygote's memory.
    import ctypes

    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    sock.send(b"ready")
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 256, 3)
        except OSError:
            os._exit(0)
        if not msg:
            os._exit(0)
        words = msg.decode().split()
        if words[0] == "spawn":
            pid = os.fork()
            if pid == 0:
                sock.close()
                os.setsid()
                fd_in, fd_out, fd_log = fds
                os.dup2(fd_log, 1)
                os.dup2(fd_log, 2)
                os.close(fd_log)
                _session_main(fd_in, fd_out)
            for fd in fds:
                os.close(fd)
            sock.send(str(pid).encode())
        elif words[0] == "wait":
            # "wait PID [SECONDS]": reap the child, killing its process group after SECONDS. Done here,
            # not by the parent, because in the jail PID is a pid of the jail's own namespace.
            pid, limit = int(words[1]), float(words[2]) if len(words) > 2 else None
            deadline = None if limit is None else time.monotonic() + limit
            while True:
                done, status = os.waitpid(pid, os.WNOHANG if deadline is not None else 0)
                if done:
                    break
                if time.monotonic() >= deadline:
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except OSError:
                        pass
                    deadline = None
                    continue
                time.sleep(0.01)
            sock.send(str(os.waitstatus_to_exitcode(status)).encode())


if __name__ == "__main__":
    if sys.argv[1] == "--sys-path":
        # In the bubblewrap jail (sandbox.py): python3 -I -S, with only torch's site-packages on the path.
        sys.path.insert(0, sys.argv[2])
        del sys.argv[1:3]
    if sys.argv[1] == "--session":
        _session_main(int(sys.argv[2]), int(sys.argv[3]))
    elif sys.argv[1] == "--zygote":
        _zygote_main(int(sys.argv[2]))
    else:
        raise SystemExit(f"usage: {sys.argv[0]} --session FD_IN FD_OUT | --zygote CTL_FD")
