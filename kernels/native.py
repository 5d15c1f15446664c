"""Building and loading the C kernels of the CPU paths (`kernels/*/*_cpu.c`, `vecmath.h`).

Each kernel is a plain C file (no torch or Python headers) compiled with the system C compiler,

    cc -O3 -shared -fPIC -ffp-contract=off -fno-math-errno -Wno-psabi -o lib.so file.c

in about a second, and called through ctypes on tensors' data pointers. A library is built once
per source (its text and vecmath.h's), flags and compiler version into `$K3_KERNEL_CACHE` (default
`~/.cache/k3-recipe/kernels`), written under a temporary name and renamed, so concurrent processes
(Ray workers) never load a half-written file. `load()` returns None when there is no compiler or the
build fails, and `load_error()` says why: the callers then take their torch paths and log it.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

FLAGS = ("-O3", "-shared", "-fPIC", "-ffp-contract=off", "-fno-math-errno", "-Wno-psabi")
HEADER = Path(__file__).with_name("vecmath.h")

_LIBS: dict[Path, ctypes.CDLL] = {}
_ERRORS: dict[Path, str] = {}


def cache_dir() -> Path:
    return Path(os.environ.get("K3_KERNEL_CACHE") or Path.home() / ".cache" / "k3-recipe" / "kernels")


def compiler() -> str | None:
    """The C compiler to use: $CC, else the first of cc, gcc, clang on PATH; None when there is none."""
    return next((shutil.which(c) for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c and shutil.which(c)), None)


def build(source: Path) -> Path:
    """Compile `source` unless this text, header, compiler and flags were built already; returns
    the library's path. Raises RuntimeError with the compiler's message when it cannot."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (tried $CC, cc, gcc, clang)")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    key = hashlib.sha256(source.read_bytes() + HEADER.read_bytes() + repr((cc, version, FLAGS)).encode())
    out = cache_dir() / f"{source.stem}-{key.hexdigest()[:16]}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        proc = subprocess.run([cc, *FLAGS, "-o", tmp, str(source)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed on {source.name}: {proc.stderr.strip()[-2000:]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def load(source: Path, signatures: dict[str, list]) -> ctypes.CDLL | None:
    """The library built from `source` (built on first use) with `signatures` (function name →
    ctypes argument types) set, or None when it cannot be built (`load_error(source)` says why)."""
    if source not in _LIBS and source not in _ERRORS:
        try:
            lib = ctypes.CDLL(str(build(source)))
        except (RuntimeError, OSError) as err:
            _ERRORS[source] = str(err)
            return None
        for name, argtypes in signatures.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, None
        _LIBS[source] = lib
    return _LIBS.get(source)


def load_error(source: Path) -> str | None:
    return _ERRORS.get(source)


PTR, I64, F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


CHOICES = ("auto", "c", "torch")


def choice() -> str:
    """`K3_CPU_KERNELS`: "auto" (default: the C kernels where they apply and build, else torch, logged),
    "c" (insist: a failed build raises), "torch" (the torch paths only)."""
    value = os.environ.get("K3_CPU_KERNELS", "auto")
    if value not in CHOICES:
        raise ValueError(f"K3_CPU_KERNELS must be one of {CHOICES}, got {value!r}")
    return value


def build_failed(kernel: str, error: str | None) -> str:
    """For a dispatcher whose C kernel did not build: with K3_CPU_KERNELS=c a ValueError that says what
    to do; otherwise the reason to log beside the torch path it falls back to."""
    if choice() == "c":
        raise ValueError(f"K3_CPU_KERNELS=c but the {kernel} kernel could not be built: {error}; "
                         "install a C compiler (gcc) or unset K3_CPU_KERNELS")
    return f"the C kernel could not be built: {error}"
