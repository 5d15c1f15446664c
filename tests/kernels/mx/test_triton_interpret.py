"""The Triton MX kernels on the CPU through the interpreter (small sizes: the interpreter is slow)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[3]


CHECKS = ["gemv", "gemm", "dequant_kernel", "nan_weight_block", "fake_quant_kernel", "mx_linear_dispatch",
          "f16x2_ops", "gemv_grouped"]


@pytest.mark.parametrize("check", CHECKS)
def test_triton_kernel_under_the_interpreter(check):
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", "tests.kernels.mx.interpret_checks", check],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
