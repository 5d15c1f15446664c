"""The verifier's evaluator of hidden test cases, run as `python3 -I -S` in a jail after the episode.

A hidden case is (id, setup, expr): `setup` imports what the case needs from the submitted code and
`expr` is the call whose result is checked. This script evaluates every expression and writes
{id: ["ok", canon(value)] | ["raised", exception name]} as JSON. It never sees the expected values:
the verifier compares on the host (envs/tasks/coding.py), so a submission that takes over this
process (it runs in it, being imported by the setups) can forge values but not know which are right.

    python3 -I -S hidden_runner.py CODE_DIR CASES_JSON OUT_JSON

`canon` is the exact-type canonical form both sides compare (an object with an always-true __eq__,
or a subclass of int, is not its builtin; floats are rounded to 9 places). Standard library only.
"""

import json
import sys


def canon(x):
    t = type(x)
    if t in (int, str, bool, type(None)):
        return [t.__name__, x]
    if t is float:
        return ["float", round(x, 9)]
    if t in (list, tuple):
        return [t.__name__, [canon(v) for v in x]]
    if t is dict:
        return ["dict", sorted([json.dumps(canon(k)), canon(v)] for k, v in x.items())]
    raise TypeError("unexpected result type " + t.__name__)


def evaluate(cases: list) -> dict:
    results = {}
    for case in cases:
        try:
            ns: dict = {}
            exec(case["setup"], ns)
            results[case["id"]] = ["ok", canon(eval(case["expr"], ns))]
        except BaseException as e:  # noqa: BLE001 - SystemExit in the code is a failed case too
            results[case["id"]] = ["raised", type(e).__name__]
    return results


def main(argv: list) -> int:
    code_dir, cases_path, out_path = argv[1:4]
    sys.path.insert(0, code_dir)
    sys.dont_write_bytecode = True
    with open(cases_path) as f:
        cases = json.load(f)
    results = evaluate(cases)
    with open(out_path, "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
