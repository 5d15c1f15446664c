"""The accumulate="f16x2" GEMV compiles for sm_90 (its inline PTX passes ptxas) and its K loop is made
of packed fp16 FMAs rather than one FFMA per weight value; checked on the CPU from the SASS that the
Triton wheel's ptxas and cuobjdump produce (sass_checks.py). Timing is benchmarks/mx_variants.py's."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


@pytest.mark.skipif(not ((BIN / "ptxas").exists() and (BIN / "cuobjdump").exists()),
                    reason="the Triton wheel's NVIDIA backend tools (ptxas, cuobjdump) are not installed")
def test_f16x2_gemv_compiles_for_sm90_with_packed_fmas():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "tests.kernels.mx.sass_checks"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for block_n in (32, 64):
        f16, f32 = report[f"f16x2/block_n={block_n}"], report[f"f32/block_n={block_n}"]
        # One packed FMA per two weight values, and no per-value FFMA left.
        assert f16["hfma2"] >= f16["values_per_thread"] // 2, f16
        assert f16["ffma"] <= f16["values_per_thread"] // 16, f16
        assert f32["ffma"] >= f32["values_per_thread"], f32
        assert f16["per_value"] < f32["per_value"], (f16, f32)
