"""A tiny test runner, copied into coding workspaces as `run_tests.py` for the visible tests.

It imports every `test_*.py` in a tests directory, calls every module-level `test_*` function and
reports each as pass or fail. It depends on nothing but the standard library.

    python run_tests.py                          # the agent: visible tests in ./tests, code in .
    python -I -S unit_runner.py CODE TESTS OUT   # a JSON report to OUT

The verifier does not use it: hidden cases are evaluated by hidden_runner.py and judged on the host.
"""

import importlib.util
import json
import sys
import traceback
from pathlib import Path


def run(code_dir: str, tests_dir: str) -> dict:
    sys.path.insert(0, str(Path(code_dir).resolve()))
    sys.dont_write_bytecode = True
    results = {}
    for path in sorted(Path(tests_dir).glob("test_*.py")):
        name = f"_k3_tests_{path.stem}"
        try:
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except BaseException as e:  # noqa: BLE001 - a broken import is a failed test, whatever it raised
            results[f"{path.stem}::<import>"] = f"fail: {type(e).__name__}: {e}"
            continue
        for attr in sorted(vars(module)):
            fn = getattr(module, attr)
            if attr.startswith("test_") and callable(fn):
                try:
                    fn()
                    results[f"{path.stem}::{attr}"] = "pass"
                except BaseException as e:  # noqa: BLE001 - SystemExit inside a test is a failure too
                    tb = traceback.extract_tb(e.__traceback__)[-1]
                    results[f"{path.stem}::{attr}"] = f"fail: {type(e).__name__}: {e} (line {tb.lineno})"
    return results


def main(argv: list) -> int:
    if len(argv) == 4:
        results = run(argv[1], argv[2])
        Path(argv[3]).write_text(json.dumps(results, sort_keys=True))
        return 0
    results = run(".", "tests")
    for key, res in results.items():
        print(("PASS " if res == "pass" else "FAIL ") + key + ("" if res == "pass" else "  " + res[6:]))
    failed = sum(res != "pass" for res in results.values())
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
