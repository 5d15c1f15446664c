"""What the envs sandbox costs and what it stops, measured in one run.

    OMP_NUM_THREADS=1 PYTHONPATH=. python3 benchmarks/envs/envs_sandbox.py --out benchmarks/results/envs/2026-12-01_sandbox.json

- Cost per command: `true` and `python -c pass`, through the bubblewrap jail of this tree
  (envs/jail.py: cgroup join, prlimit, setpriv, bwrap) and through the jail of commit BASELINE
  (unshare --net + prlimit, no file-system isolation), loaded from git into a temporary module;
  interleaved, `--n` each, median and p90 in milliseconds.
- Hostile parses: for each harness, the slowest of envs.adversarial.hostile_texts(200_000), and the
  same text's plain Python scan (the yardstick the test uses).
- The attack battery: every envs.adversarial.ATTACKS episode; attempts, escapes (reward > 0 or any
  host-side finding) and host crashes (an exception out of the public API).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from benchmarks.common import ROOT, run_header
from envs import adversarial
from envs.harnesses import HARNESSES, ToolSet, get_harness
from envs.jail import Jail, Limits, isolation
from envs.sandbox import Sandbox

BASELINE = "a115475"  # the last commit with the unshare-only jail


def _baseline_jail():
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{BASELINE}:envs/jail.py"], capture_output=True,
                         text=True, check=True).stdout
    with tempfile.TemporaryDirectory(prefix="k3-bench-") as d:
        path = Path(d) / "jail_baseline.py"
        path.write_text(src)
        spec = importlib.util.spec_from_file_location("jail_baseline", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["jail_baseline"] = mod  # dataclasses look their module up there
        spec.loader.exec_module(mod)
    return mod


def _ms(samples: list[float]) -> dict:
    s = sorted(samples)
    return {"median_ms": round(1000 * statistics.median(s), 2), "p90_ms": round(1000 * s[int(0.9 * (len(s) - 1))], 2),
            "n": len(s)}


def command_cost(n: int) -> dict:
    old = _baseline_jail()
    sb = Sandbox()
    old_dir = Path(tempfile.mkdtemp(prefix="k3-bench-old-"))
    out = {}
    try:
        for label, cmd in (("true", "true"), ("python -c pass", "python -c pass")):
            new_t, old_t = [], []
            for _ in range(n):
                t = time.perf_counter()
                sb.jail.run_command(cmd)
                new_t.append(time.perf_counter() - t)
                t = time.perf_counter()
                old.run_command(cmd, old_dir, old.Limits())
                old_t.append(time.perf_counter() - t)
            out[label] = {"bwrap_jail": _ms(new_t), "baseline_jail": _ms(old_t),
                          "extra_ms": round(1000 * (statistics.median(new_t) - statistics.median(old_t)), 2)}
    finally:
        sb.close()
        subprocess.run(["rm", "-rf", str(old_dir)], check=False)
    return out


def _plain_scan(text: str) -> int:
    n = 0
    for ch in text:
        n += ch == "<"
    return n


def hostile_parses() -> dict:
    full = ToolSet(files=True, run=True, apps=("gmail", "notion", "slack", "canvas", "clock"))
    texts = adversarial.hostile_texts(200_000)
    out = {}
    for name in HARNESSES:
        h = get_harness(name)
        worst = (0.0, "", 0.0)
        for label, text in texts.items():
            took = min(_timed(lambda: h.parse(text, full)) for _ in range(2))
            if took > worst[0]:
                worst = (took, label, min(_timed(lambda: _plain_scan(text)) for _ in range(2)))
        out[name] = {"worst_s": round(worst[0], 5), "text": worst[1], "plain_scan_s": round(worst[2], 5),
                     "ratio": round(worst[0] / worst[2], 2)}
    return out


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def battery() -> dict:
    rows = []
    crashes = 0
    with adversarial.host() as h:
        for attack in adversarial.ATTACKS:
            try:
                r = adversarial.run_attack(attack, h)
                rows.append({"attack": r.attack, "kind": r.kind, "reward": r.reward, "escapes": r.escapes,
                             "seconds": round(r.seconds, 2), "usage": r.usage})
            except Exception:  # noqa: BLE001 - a crash is what this counts
                crashes += 1
                rows.append({"attack": attack.name, "kind": attack.kind, "crash": traceback.format_exc()[-2000:]})
    escapes = sum(1 for r in rows if r.get("reward", 0) > 0 or r.get("escapes"))
    return {"attempts": len(rows), "escapes": escapes, "host_crashes": crashes, "attacks": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    t0 = time.time()
    res = {
        "benchmark": "envs_sandbox", "header": run_header(),
        "note": "2-core machine shared with other jobs; the comparisons are within this run",
        "isolation": isolation(),
        "command_cost": command_cost(args.n),
        "hostile_parse": hostile_parses(),
        "battery": battery(),
    }
    res["seconds"] = round(time.time() - t0, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    b = res["battery"]
    print(json.dumps({"command_cost": res["command_cost"], "hostile_parse": res["hostile_parse"],
                      "battery": {k: b[k] for k in ("attempts", "escapes", "host_crashes")}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
