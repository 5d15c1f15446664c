"""The fused CPU SiTU-GLU: `situ_glu_cpu.c` built with the system C compiler, called through ctypes.

In eager torch SiTU-GLU is ~10 elementwise passes forward and ~12 backward, two of them tanh at
~2.4 ns an element on this machine's AVX-512 dispatch; the tiny training step runs it over ~3M
elements (issue 17, docs/log/tiny.md). The C kernel reads g and v once and writes y forward, reads
g, v and dy and writes dg and dv backward, with its own tanh and exp (about 1–2 ulp, torch's about 1;
the file's comment says why it needs its own).

Build: `cc -O3 -shared -fPIC -ffp-contract=off` (plus -fno-math-errno, no torch headers: a
second, not a minute), once per source and compiler into `$K3_KERNEL_CACHE` (default
`~/.cache/k3-recipe/kernels`), written under a temporary name and renamed, so concurrent processes
(Ray workers) never load a half-written library. `load()` returns None and says why when there is
no compiler or the build fails; `kernels.situ_glu` then takes the torch path and logs it.

Legend: N elements (any shape, flattened; contiguous fp32 on the CPU).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("situ_glu_cpu.c")
FLAGS = ("-O3", "-shared", "-fPIC", "-ffp-contract=off", "-fno-math-errno", "-Wno-psabi")

_LIB: ctypes.CDLL | None = None
_LOAD_ERROR: str | None = None


def cache_dir() -> Path:
    return Path(os.environ.get("K3_KERNEL_CACHE") or Path.home() / ".cache" / "k3-recipe" / "kernels")


def _compiler() -> str | None:
    return next((shutil.which(c) for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c and shutil.which(c)), None)


def build() -> Path:
    """Compile the kernel if this source and compiler have not been built yet; return the library's path.
    Raises RuntimeError with the compiler's message when there is no compiler or it fails."""
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (tried $CC, cc, gcc, clang)")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    key = hashlib.sha256(SOURCE.read_bytes() + repr((cc, version, FLAGS)).encode()).hexdigest()[:16]
    out = cache_dir() / f"situ_glu_cpu-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        proc = subprocess.run([cc, *FLAGS, "-o", tmp, str(SOURCE)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed on {SOURCE.name}: {proc.stderr.strip()[-2000:]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def load() -> ctypes.CDLL | None:
    """The built library (built on first use), or None when it cannot be built: `load_error()` says why."""
    global _LIB, _LOAD_ERROR
    if _LIB is None and _LOAD_ERROR is None:
        try:
            lib = ctypes.CDLL(str(build()))
        except (RuntimeError, OSError) as err:
            _LOAD_ERROR = str(err)
            return None
        ptr, n, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
        lib.situ_glu_forward.argtypes = [ptr, ptr, ptr, n, f32, f32]
        lib.situ_glu_forward.restype = None
        lib.situ_glu_backward.argtypes = [ptr, ptr, ptr, ptr, ptr, n, f32, f32]
        lib.situ_glu_backward.restype = None
        _LIB = lib
    return _LIB


def load_error() -> str | None:
    return _LOAD_ERROR


class _SituGLUFunction(torch.autograd.Function):
    """y = SiTU-GLU(g, v) on contiguous fp32 CPU tensors; the backward recomputes from g and v."""

    @staticmethod
    def forward(ctx, g: torch.Tensor, v: torch.Tensor, beta1: float, beta2: float) -> torch.Tensor:
        y = torch.empty_like(g)
        _LIB.situ_glu_forward(g.data_ptr(), v.data_ptr(), y.data_ptr(), g.numel(), beta1, beta2)
        ctx.save_for_backward(g, v)
        ctx.betas = (beta1, beta2)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy: torch.Tensor):
        g, v = ctx.saved_tensors
        dy = dy.float().contiguous()
        dg, dv = torch.empty_like(g), torch.empty_like(v)
        _LIB.situ_glu_backward(g.data_ptr(), v.data_ptr(), dy.data_ptr(), dg.data_ptr(), dv.data_ptr(), g.numel(),
                               *ctx.betas)
        return dg, dv, None, None


def situ_glu_cpu(gate: torch.Tensor, up: torch.Tensor, beta1: float, beta2: float) -> torch.Tensor:
    """SiTU-GLU by the C kernel (`load()` must have succeeded): in fp32, returned in gate's dtype."""
    if gate.shape != up.shape:
        raise ValueError(f"SiTU-GLU needs gate and up of one shape, got {tuple(gate.shape)} and {tuple(up.shape)}")
    g = gate.float().contiguous()
    v = up.float().contiguous()
    return _SituGLUFunction.apply(g, v, float(beta1), float(beta2)).to(gate.dtype)
