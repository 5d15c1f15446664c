"""Runs tests/kernels/mx/sass_checks.py in a subprocess for the SASS/PTX tests and returns its report.

A subprocess, because sass_checks AOT-compiles the real kernels: it must run without TRITON_INTERPRET
(which replaces them), whatever the test session's environment."""

import json
import os
import subprocess
import sys
from pathlib import Path

import triton

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
# The Triton wheel's NVIDIA backend tools that sass_checks needs.
TOOLS = (BIN / "ptxas").exists() and (BIN / "cuobjdump").exists()
NO_TOOLS = "the Triton wheel's NVIDIA backend tools (ptxas, cuobjdump) are not installed"


def sass_report(*args: str) -> dict:
    """`python -m tests.kernels.mx.sass_checks ARGS`'s JSON report (its last output line)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "tests.kernels.mx.sass_checks", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])
