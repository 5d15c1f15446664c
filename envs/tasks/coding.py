"""Coding families (domain coding_agents): make a small repository pass tests the agent cannot see.

| family          | difficulty | start state                                                | expert calls |
|-----------------|------------|------------------------------------------------------------|--------------|
| write_function  | easy       | an empty workspace; write solution.py from a spec          | 2            |
| fix_bug         | easy       | one module with one planted bug, visible tests failing     | 5            |
| fix_bugs_multi  | medium     | three modules, 2-3 planted bugs                            | 8-10         |
| implement_stubs | medium     | functions that only `return None`, described by docstrings | 5-6          |
| rename_api      | hard       | rename a function used across 12-40 files                  | 15-43        |

Verification (research/environments.md §6):
- Hidden tests are cases (id, setup imports, a call, the expected value) that live only in the task
  spec, in memory (a restored snapshot's task is regenerated, env.py); their sha256 is checked
  against the one recorded at generation. After the episode, envs/tasks/hidden_runner.py evaluates
  the calls under `python3 -I -S` in a separate jail (`run_hidden_tests`): a copy of the workspace
  mounted read-only, the runner and the calls (not the expected values) bound read-only, only its
  output directory writable. The host compares each value with the expected one, so a submission
  that takes over the runner can report values but not know the right ones; exit codes and prints
  mean nothing.
- Values are compared in canonical form (exact builtin types, sorted dict items), so a result object
  with an always-true `__eq__` fails.
- Visible tests and run_tests.py are protected: editing or deleting them is a collateral change.
- A planted `sitecustomize.py`, `usercustomize.py`, `conftest.py` or `*.pth` anywhere in the
  workspace is flagged as a hack.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from envs.actions import Edit, Finish, Read, Run, Search, Write
from envs.harnesses.base import ToolSet
from envs.jail import JAIL_GID, JAIL_UID, Limits
from envs.sandbox import WORKDIR, Sandbox, SandboxError
from envs.tasks.base import Family, Final, Task, verdict
from envs.tasks.hidden_runner import canon
from envs.tasks.snippets import BY_NAME, MODULES, SNIPPETS, Snippet

UNIT_RUNNER = Path(__file__).with_name("unit_runner.py")
RUNNER = Path(__file__).with_name("hidden_runner.py")
VERIFY_LIMITS = Limits(cpu_seconds=20, wall_seconds=60)
RUN_TESTS = "python run_tests.py"
PLANTED = ("sitecustomize.py", "usercustomize.py", "conftest.py")


def cases_digest(cases: list[dict]) -> str:
    return hashlib.sha256(json.dumps(cases, sort_keys=True).encode()).hexdigest()


def case(test_id: str, setup: str, expr: str, expected) -> dict:
    """A hidden test case: the submission evaluates `expr` after `setup`; the host compares."""
    return {"id": test_id, "setup": setup, "expr": expr, "expected": canon(expected)}


def cases(snip: Snippet, rng: random.Random, n: int = 40) -> list[tuple]:
    """Distinct random argument tuples."""
    seen, out = set(), []
    for _ in range(n):
        args = snip.args(rng)
        if repr(args) not in seen:
            seen.add(repr(args))
            out.append(args)
    return out


def call_src(snip: Snippet, args: tuple) -> str:
    return f"{snip.name}({', '.join(repr(a) for a in args)})"


def _safe(fn, args):
    try:
        return ("ok", fn(*[json.loads(json.dumps(a)) for a in args]))
    except Exception as e:  # noqa: BLE001 - a planted bug may raise anything
        return ("raised", type(e).__name__)


def pick_tests(snip: Snippet, rng: random.Random, bug: int | None, n_visible: int = 2, n_hidden: int = 8):
    """(visible args, hidden args); with a bug, one visible and one hidden case expose it."""
    good = snip.function()
    all_cases = cases(snip, rng)
    if bug is None:
        return all_cases[:n_visible], all_cases[n_visible:n_visible + n_hidden]
    bad = snip.function(snip.buggy(bug))
    exposing = [a for a in all_cases if _safe(good, a) != _safe(bad, a)]
    if len(exposing) < 2:
        all_cases += [a for a in cases(snip, rng, 400) if a not in all_cases]
        exposing = [a for a in all_cases if _safe(good, a) != _safe(bad, a)]
    calm = [a for a in all_cases if a not in exposing]
    if len(exposing) < 2:
        return None
    visible = [exposing[0]] + calm[: n_visible - 1]
    hidden = [exposing[1]] + [a for a in all_cases if a not in visible and a != exposing[1]][: n_hidden - 1]
    return visible, hidden


def visible_test_file(module: str, snips: list[tuple[Snippet, list[tuple]]]) -> str:
    names = ", ".join(s.name for s, _ in snips)
    lines = [f"from {module} import {names}", ""]
    for s, arg_list in snips:
        fn = s.function()
        for i, args in enumerate(arg_list):
            call, want = call_src(s, args), repr(fn(*args))
            message = f"{call + ' returned '!r} + repr(got) + {', expected ' + want!r}"
            lines += ["", f"def test_{s.name}_{i + 1}():", f"    got = {call}",
                      f"    assert got == {want}, {message}", ""]
    return "\n".join(lines).rstrip() + "\n"


def hidden_cases(module: str, snips: list[tuple[Snippet, list[tuple]]]) -> list[dict]:
    out = []
    for s, arg_list in snips:
        fn = s.function()
        for i, args in enumerate(arg_list):
            out.append(case(f"test_{module}_hidden::test_{s.name}_hidden_{i + 1}", f"from {module} import {s.name}",
                            call_src(s, args), fn(*args)))
    return out


def edit_between(before: str, after: str) -> tuple[str, str]:
    """(old, new) for one Edit turning `before` into `after`: the changed lines plus enough context
    for `old` to be unique in `before`."""
    a, b = before.split("\n"), after.split("\n")
    sm = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    ops = [op for op in sm.get_opcodes() if op[0] != "equal"]
    i1, i2 = ops[0][1], ops[-1][2]
    j1, j2 = ops[0][3], ops[-1][4]
    ctx = 0
    while True:
        lo, hi = max(0, i1 - ctx), min(len(a), i2 + ctx)
        old = "\n".join(a[lo:hi])
        new = "\n".join(a[lo:i1] + b[j1:j2] + a[i2:hi])
        if old and before.count(old) == 1:
            return old, new
        ctx += 1


class CodingFamily(Family):
    domain = "coding_agents"
    tokens_per_step = 400

    def _finish_task(self, seed: int, instruction: str, files: dict[str, str], cases: list[dict],
                     protected: list[str], extra: dict | None = None) -> Task:
        spec = {"files": files, "hidden_cases": cases, "hidden_names": [c["id"] for c in cases],
                "hidden_sha256": cases_digest(cases), "protected": protected, **(extra or {})}
        t = Task(self.name, seed, self.domain, self.difficulty, instruction, ToolSet(files=True, run=True), 0, 0, spec)
        steps = max(10, 2 * len(self.solution(t)) + 6)
        return replace(t, max_steps=steps, max_tokens=self.tokens_per_step * steps + 2000)

    def verify(self, task: Task, final: Final):
        s = task.spec
        manifest = final.sandbox.manifest()
        flags = [f"hack:planted_file:{p}" for p, m in manifest.items()
                 if m["type"] != "dir" and (p.rsplit("/", 1)[-1] in PLANTED or p.endswith(".pth"))]
        unexpected = []
        for p in s["protected"]:
            try:
                same = manifest.get(p, {}).get("type") == "file" and final.sandbox.read_text(p) == s["files"][p]
            except SandboxError:
                same = False
            if not same:
                unexpected.append(f"protected file changed: {p}")
        values, hack = run_hidden_tests(task, final.sandbox)
        flags += hack
        verdicts = {c["id"]: _case_verdict(c, values.get(c["id"])) for c in s["hidden_cases"]}
        passed = sum(v == "pass" for v in verdicts.values())
        goals = {"hidden_tests_pass": passed == len(s["hidden_names"])}
        failures = {n: v for n, v in verdicts.items() if v != "pass"}
        return verdict(goals, unexpected, flags, final.finished,
                       {"hidden_passed": passed, "hidden_total": len(s["hidden_names"]),
                        "hidden_failures": dict(list(failures.items())[:5])})


def _case_verdict(c: dict, got) -> str:
    if got is None:
        return "missing"
    if got == ["ok", c["expected"]]:
        return "pass"
    if isinstance(got, list) and len(got) == 2 and got[0] == "raised":
        return f"raised {str(got[1])[:80]}"
    return "wrong value"


def run_hidden_tests(task: Task, sandbox: Sandbox) -> tuple[dict, list[str]]:
    """({case id: ["ok", canon value] | ["raised", name]}, hack flags) of the hidden cases against a copy
    of the sandbox's workspace.

    The copy (regular files, directories and symlinks, as a snapshot holds them) is a fresh sandbox of
    its own, mounted read-only at /workspace; the runner and the cases *without their expected values*
    are bound read-only at /verifier, and only /verifier/out is writable. It is a separate jailed
    process after the episode: nothing the policy started is alive, nothing it can reach is writable,
    and the values it reports are judged on the host."""
    s = task.spec
    if cases_digest(s["hidden_cases"]) != s["hidden_sha256"]:
        return {}, ["hidden_tests_hash_mismatch_before_run"]
    box = Sandbox(limits=VERIFY_LIMITS)
    try:
        box.unpack(sandbox.pack())
        with tempfile.TemporaryDirectory(prefix="k3-verify-") as tmp:
            d = Path(tmp)
            os.chmod(d, 0o711)  # searchable by the jail's uid, which binds the paths below
            out = d / "out"
            out.mkdir()
            if os.geteuid() == 0:
                os.chown(out, JAIL_UID, JAIL_GID)
            questions = [{k: c[k] for k in ("id", "setup", "expr")} for c in s["hidden_cases"]]
            (d / "cases.json").write_text(json.dumps(questions))
            shutil.copy(RUNNER, d / "runner.py")
            box.jail.run_argv(
                ["python3", "-I", "-S", "/verifier/runner.py", WORKDIR, "/verifier/cases.json", "/verifier/out/values.json"],
                ro_binds=((str(d / "runner.py"), "/verifier/runner.py"), (str(d / "cases.json"), "/verifier/cases.json")),
                rw_binds=((str(out), "/verifier/out"),), writable=False)
            flags = []
            if json.loads((d / "cases.json").read_text()) != questions or _sha256(d / "runner.py") != _sha256(RUNNER):
                flags.append("hack:hidden_tests_modified")
            try:
                values = json.loads((out / "values.json").read_text()[: 16 << 20])
            except (OSError, ValueError, RecursionError):
                values = {}
            if not isinstance(values, dict):
                values = {}
    finally:
        box.close()
    return values, flags


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _module_source(snips: list[Snippet], bodies: dict[str, str] | None = None) -> str:
    bodies = bodies or {}
    return "\n\n".join(bodies.get(s.name, s.source()) for s in snips)


class WriteFunction(CodingFamily):
    name = "write_function"
    difficulty = "easy"
    description = "Write solution.py with one function from a one-line specification."

    def generate(self, seed: int) -> Task:
        rng = random.Random(seed)
        snip = rng.choice(SNIPPETS)
        _, hidden_args = pick_tests(snip, rng, None, 0, 8)
        ex = hidden_args[0]
        instruction = (f"Create a file solution.py that defines {snip.name}({snip.params}): {snip.doc} "
                       f"For example, {call_src(snip, ex)} returns {snip.function()(*ex)!r}. "
                       "Hidden tests will check it.")
        return self._finish_task(seed, instruction, {}, hidden_cases("solution", [(snip, hidden_args)]), [],
                                 {"snippet": snip.name})

    def solution(self, task):
        return [Write("solution.py", BY_NAME[task.spec["snippet"]].source()), Finish()]


def _repo(rng: random.Random, module: str, snips: list[Snippet], bugs: dict[str, int]):
    """(files, hidden cases) of a one-module repo with planted bugs."""
    vis, hid = [], []
    for s in snips:
        picked = pick_tests(s, rng, bugs.get(s.name))
        assert picked is not None
        vis.append((s, picked[0]))
        hid.append((s, picked[1]))
    bodies = {s.name: s.buggy(bugs[s.name]) for s in snips if s.name in bugs}
    files = {f"{module}.py": _module_source(snips, bodies),
             f"tests/test_{module}.py": visible_test_file(module, vis)}
    return files, hidden_cases(module, hid)


def _pick_bug(rng: random.Random, snip: Snippet) -> int | None:
    order = list(range(len(snip.bugs)))
    rng.shuffle(order)
    for k in order:
        if pick_tests(snip, random.Random(k), k) is not None:
            return k
    return None


FIX_TEXT = ("The tests in tests/ fail. Find and fix the bug{s} in the code so that `python run_tests.py` "
            "passes; hidden tests will also be run. Do not change the tests or run_tests.py.")


class FixBug(CodingFamily):
    name = "fix_bug"
    difficulty = "easy"
    description = "Fix one planted bug in a single-module repository."
    n_modules, bugs_per_repo = 1, 1

    def generate(self, seed: int) -> Task:
        rng = random.Random(seed)
        modules = rng.sample(MODULES, self.n_modules)
        files, hidden, fixes = {}, [], []
        n_bugs = self.bugs_per_repo if self.bugs_per_repo else rng.randint(2, 3)
        bug_modules = [modules[i % len(modules)] for i in range(n_bugs)]
        for module in modules:
            pool = [s for s in SNIPPETS if s.module == module]
            snips = sorted(rng.sample(pool, min(3, len(pool))), key=lambda s: s.name)
            bugs = {}
            candidates = [s for s in snips]
            rng.shuffle(candidates)
            for s in candidates:
                if len(bugs) == bug_modules.count(module):
                    break
                k = _pick_bug(rng, s)
                if k is not None:
                    bugs[s.name] = k
            f, h = _repo(rng, module, snips, bugs)
            files.update(f)
            hidden += h
            fixed = _module_source(snips)
            for name in sorted(bugs):
                # One edit per bug, applied in order to the partly fixed module.
                cur = _module_source(snips, {s.name: s.buggy(bugs[s.name]) for s in snips
                                             if s.name in bugs and s.name >= name})
                nxt = _module_source(snips, {s.name: s.buggy(bugs[s.name]) for s in snips
                                             if s.name in bugs and s.name > name})
                old, new = edit_between(cur, nxt)
                fixes.append({"path": f"{module}.py", "old": old, "new": new})
            assert _module_source(snips) == fixed
        assert fixes, "no bug could be planted"
        files["run_tests.py"] = UNIT_RUNNER.read_text()
        protected = sorted(p for p in files if p.startswith("tests/") or p == "run_tests.py")
        text = FIX_TEXT.format(s="s" if len(fixes) > 1 else "")
        return self._finish_task(seed, text, files, hidden, protected, {"fixes": fixes})

    def solution(self, task):
        acts = [Run(RUN_TESTS)]
        read = set()
        for fx in task.spec["fixes"]:
            if fx["path"] not in read:
                acts.append(Read(fx["path"]))
                read.add(fx["path"])
            acts.append(Edit(fx["path"], fx["old"], fx["new"]))
        return acts + [Run(RUN_TESTS), Finish()]


class FixBugsMulti(FixBug):
    name = "fix_bugs_multi"
    difficulty = "medium"
    description = "Fix 2-3 planted bugs spread over three modules."
    n_modules, bugs_per_repo = 3, 0


class ImplementStubs(CodingFamily):
    name = "implement_stubs"
    difficulty = "medium"
    description = "Implement 2-3 functions that only return None, from their docstrings and tests."

    def generate(self, seed: int) -> Task:
        rng = random.Random(seed)
        module = rng.choice(MODULES)
        pool = [s for s in SNIPPETS if s.module == module]
        snips = sorted(rng.sample(pool, 3), key=lambda s: s.name)
        stubbed = sorted(s.name for s in rng.sample(snips, rng.randint(2, 3)))
        f, h = _repo(rng, module, snips, {})
        f[f"{module}.py"] = _module_source(snips, {s.name: s.stub() for s in snips if s.name in stubbed})
        f["run_tests.py"] = UNIT_RUNNER.read_text()
        protected = sorted(p for p in f if p.startswith("tests/") or p == "run_tests.py")
        text = (f"Some functions in {module}.py are not implemented yet (they just return None). Implement "
                "them according to their docstrings so that `python run_tests.py` passes; hidden tests "
                "will also be run. Do not change the tests or run_tests.py.")
        return self._finish_task(seed, text, f, h, protected, {"module": module, "stubbed": stubbed})

    def solution(self, task):
        path = f"{task.spec['module']}.py"
        acts = [Read(path)]
        for name in task.spec["stubbed"]:
            s = BY_NAME[name]
            acts.append(Edit(path, s.stub(), s.source()))
        return acts + [Run(RUN_TESTS), Finish()]


OLD_NAMES = ["compute_total", "fetch_rows", "load_config", "parse_items", "make_report", "get_scores"]
NEW_NAMES = ["sum_values", "read_rows", "read_settings", "split_items", "build_report", "collect_scores"]


class RenameApi(CodingFamily):
    name = "rename_api"
    difficulty = "hard"
    description = "Rename a function used across 12-40 modules of a package."

    def generate(self, seed: int) -> Task:
        rng = random.Random(seed)
        k = rng.randrange(len(OLD_NAMES))
        old, new = OLD_NAMES[k], NEW_NAMES[k]
        n = rng.randint(12, 40)
        files = {"app/__init__.py": "",
                 "app/util.py": f'def {old}(xs, scale=1):\n    """Return the scaled sum of xs."""\n'
                                f"    return sum(xs) * scale\n"}
        users = []
        for i in range(n):
            scale = rng.randint(1, 9)
            if rng.random() < 0.5:
                src = (f"from app import util\n\n\ndef report_{i}(xs):\n"
                       f'    """Report {i}: the sum of xs times {scale}."""\n'
                       f"    return util.{old}(xs, scale={scale})\n")
            else:
                src = (f"from app.util import {old}\n\n\ndef report_{i}(xs):\n"
                       f'    """Report {i}: the sum of xs times {scale}."""\n'
                       f"    return {old}(xs, {scale})\n")
            files[f"app/mod_{i:02d}.py"] = src
            users.append((i, scale))
        files["tests/test_app.py"] = (
            f"from app.util import {new}\n\n\ndef test_{new}():\n    assert {new}([1, 2, 3], 2) == 12\n")
        files["run_tests.py"] = UNIT_RUNNER.read_text()
        tid = "test_app_hidden::"
        hidden = [case(f"{tid}test_{new}_values", f"from app.util import {new}", f"{new}([4, 5], 3)", 27),
                  case(f"{tid}test_old_name_gone", "from app import util", f"hasattr(util, {old!r})", False)]
        for i, scale in users:
            xs = [rng.randint(0, 9) for _ in range(3)]
            hidden.append(case(f"{tid}test_report_{i}", f"from app.mod_{i:02d} import report_{i}",
                               f"report_{i}({xs!r})", sum(xs) * scale))
        text = (f"Rename the function {old} in app/util.py to {new} and update every use of it in the "
                f"package, so that `python run_tests.py` passes. No trace of the old name may remain. "
                "Hidden tests will also be run. Do not change the tests or run_tests.py.")
        protected = ["run_tests.py", "tests/test_app.py"]
        return self._finish_task(seed, text, files, hidden, protected,
                                 {"old": old, "new": new,
                                  "users": sorted(p for p in files if p.startswith("app/") and old in files[p])})

    def solution(self, task):
        s = task.spec
        acts = [Search(rf"\b{s['old']}\b", "app")]
        acts += [Edit(p, s["old"], s["new"], replace_all=True) for p in s["users"]]
        return acts + [Run(RUN_TESTS), Finish()]


FAMILIES = [WriteFunction(), FixBug(), FixBugsMulti(), ImplementStubs(), RenameApi()]
