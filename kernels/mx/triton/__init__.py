"""The Triton MX kernels, one file per stage, imported lazily by kernels/mx/matmul.py and quant.py
(the package itself imports nothing from triton, so `triton_available()` works without it):

    common.py      E2M1 / E8M0 decoding, the split-K reduction, host helpers, `CompiledLaunch`
    gemv.py        the decode GEMV (M <= GEMV_MAX_M) and its grouped form for routed experts
    gemm.py        the tensor-core GEMM (GEMV_MAX_M < M <= GEMM_MAX_M)
    dequant.py     MXFP4 -> bf16 in one pass (prefill, before cuBLAS)
    fake_quant.py  fused MX fake quantization (QAT)

The GEMV variants timed slower and removed (f32 block sums, packed block sums across threads, the
f32 per-word loop, the in-kernel split-K reduction, one thread per word, a pipelined row loop) are
in docs/log/mx.md with the commits that had them.
"""

from __future__ import annotations

import importlib.util
import os

_TRITON = importlib.util.find_spec("triton") is not None


def triton_available() -> bool:
    return _TRITON


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"
