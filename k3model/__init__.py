"""The K3 model and its training algorithms: plain Python + torch (no dagster, ray or mlflow)."""

import ctypes
import os

import torch

# MKL's conditional numerical reproducibility, strict: a GEMM then gives a row the same bits whatever
# the number of rows beside it and of threads. Without it MKL picks its kernel by the row count on some
# CPUs (on an AVX-512 + AMX Xeon a row of a 128-wide fp32 matmul differs at M = 4 and at M ≥ 6), and
# the engine's batched decode would not equal each row decoded alone (docs/log/engine.md). The mode
# can be set only before MKL's first call in the process; the engine checks the property it needs at
# its first CPU decode (k3model/engine.py). Set through MKL's own function rather than the MKL_CBWR
# variable, which every program this process starts would inherit.
_MKL_CBWR_AUTO, _MKL_CBWR_STRICT = 2, 0x10000


def _mkl_strict_mode() -> bool:
    try:
        set_mode = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")).mkl_serv_cbwr_set
    except (OSError, AttributeError):  # a torch build without MKL
        return False
    set_mode.argtypes, set_mode.restype = [ctypes.c_int], ctypes.c_int
    return set_mode(_MKL_CBWR_AUTO | _MKL_CBWR_STRICT) == 0


MKL_STRICT = _mkl_strict_mode()
