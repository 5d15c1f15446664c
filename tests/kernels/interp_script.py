"""Triton kernel cases under the CPU interpreter, in a fresh process: `triton.jit` picks interpreter or
compiler when the kernels are imported, so a test session that may have imported them already cannot
switch. A test file keeps its cases as functions and runs itself as a script (`run_cases` in its
`__main__`); its pytest fixture gets the results by name (`script_results`), one JSON line a case."""

from __future__ import annotations

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def run_cases(cases: dict, names: list[str]) -> None:
    """The script side: each named case (all if none) under TRITON_INTERPRET=1, with the KDA tests'
    interpreter shims (tests/kernels/kda/conftest.py: NumPy ≥ 2.4, bf16 rounding) and every torch.empty /
    empty_like NaN-poisoned, so an element a kernel forgets to write shows up; one JSON line per case."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("run with TRITON_INTERPRET=1")
    sys.path.insert(0, os.path.join(HERE, "kda"))
    import conftest

    conftest.poison_allocations()
    for name in names or list(cases):
        print(json.dumps({"case": name, **cases[name]()}), flush=True)


def script_results(path: str, timeout: float = 600) -> dict:
    """The test side: the file at `path` run as such a script; its cases' results by name. Skips
    without triton; a failing script fails the test with its output."""
    import pytest

    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, os.path.abspath(path)], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"interpreter cases failed:\n{proc.stdout}\n{proc.stderr[-4000:]}")
    return {r["case"]: r for r in map(json.loads, proc.stdout.splitlines())}
