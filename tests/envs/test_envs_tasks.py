"""Task families: metadata, experts that solve every family, and verifiers that refuse shortcuts."""

import dataclasses
import tempfile
from pathlib import Path

import pytest

import envs
from envs.actions import AppCall, Finish, Run, Write
from envs.experts import expert_policy
from envs.harnesses import HARNESSES
from envs.rollout import rollout
from envs.tasks import DIFFICULTIES, DOMAINS, generate, get_family
from envs.tasks.base import normalize_answer

FAMILIES = envs.list_envs()


def _play(env, actions, seed=None, task=None):
    """Reset and run a list of abstract actions, one per turn; returns the last step tuple."""
    env.reset(seed=seed, task=task)
    out = None
    for i, a in enumerate(actions):
        out = env.step(env.harness.render_calls([a], start_index=i))
        if out[2] or out[3]:
            break
    return out


def test_families_cover_domains_and_difficulties():
    assert len(FAMILIES) >= 15
    infos = [envs.env_info(f) for f in FAMILIES]
    assert {i["domain"] for i in infos} == set(DOMAINS)
    assert {i["difficulty"] for i in infos} == set(DIFFICULTIES)
    for domain in DOMAINS:
        easy = envs.list_envs(domain=domain, difficulty="easy")
        assert easy, domain
        # Every domain has a family a tiny model can finish in at most three calls.
        assert min(len(get_family(f).solution(generate(f, 0))) for f in easy) <= 3
    longest = max(len(get_family(f).solution(generate(f, 0))) for f in envs.list_envs(difficulty="marathon"))
    assert longest >= 1000
    with pytest.raises(ValueError):
        envs.list_envs(domain="poetry")


@pytest.mark.parametrize("family", FAMILIES)
def test_generation_is_deterministic(family):
    a, b = generate(family, 11), generate(family, 11)
    assert a == b and a.to_json() == b.to_json()
    assert envs.Task.from_json(a.to_json()) == a
    assert generate(family, 12).spec != a.spec or family == "arith_word"


@pytest.mark.parametrize("k,family", list(enumerate(FAMILIES)))
def test_expert_solves_every_family(k, family):
    # Rotate harnesses over families so every harness is exercised without running 5x as long.
    harness = HARNESSES[k % len(HARNESSES)]
    with envs.make_env(family, harness=harness) as env:
        rec = rollout(env, expert_policy(family, harness), seed=100 + k)
    assert rec["reward"] == 1.0, rec["verifier"]
    assert rec["terminated"] and not rec["truncated"]
    assert all(c["ok"] for s in rec["steps"] for c in s["calls"])


@pytest.mark.parametrize("family", FAMILIES)
def test_finishing_at_once_scores_zero(family):
    with envs.make_env(family, harness="hermes") as env:
        obs, reward, terminated, truncated, info = _play(env, [Finish("no idea")], seed=1)
    assert terminated and reward == 0.0 and not info["verifier"]["success"]


def test_collateral_changes_fail_the_task():
    fam = get_family("gmail_label")
    task = generate("gmail_label", 2)
    other = next(m for m in task.spec["world"]["gmail"]["messages"] if m["id"] != task.spec["target"])
    plan = fam.solution(task)
    extra = AppCall("gmail", "label", {"message_id": other["id"], "label": task.spec["label"]})
    with envs.make_env("gmail_label") as env:
        _, reward, *_ , info = _play(env, plan[:-1] + [extra, plan[-1]], task=task)
    assert reward == 0.0 and info["verifier"]["goals"] == {"labeled": True}
    assert any(other["id"] in u for u in info["verifier"]["unexpected_changes"])

    task = generate("canvas_submit_drafts", 3)
    plan = get_family("canvas_submit_drafts").solution(task)
    due = {t["id"] for t in task.spec["targets"]}
    course = next(c for c in task.spec["world"]["canvas"]["courses"] if c["id"] == task.spec["course"])
    late = next(a["id"] for a in course["assignments"] if a["id"] not in due)
    extra = AppCall("canvas", "submit", {"course_id": task.spec["course"], "assignment_id": late, "text": "x"})
    with envs.make_env("canvas_submit_drafts") as env:
        _, reward, *_ , info = _play(env, plan[:-1] + [extra, plan[-1]], task=task)
    assert reward == 0.0 and all(info["verifier"]["goals"].values())


def test_multi_day_goals_are_checked_per_day():
    task = generate("assistant_3day", 4)
    assert task.spec["assignments"], "seed 4 should post at least one assignment"
    plan = get_family("assistant_3day").solution(task)
    first = task.spec["assignments"][0]
    # Submit that assignment one day late: move its submit call after the next advance_day.
    i = next(k for k, a in enumerate(plan) if a.tool == "submit" and a.args["assignment_id"] == first["assignment"]
             if isinstance(a, AppCall))
    submit = plan.pop(i)
    j = next(k for k, a in enumerate(plan) if k >= i and isinstance(a, AppCall) and a.tool == "advance_day")
    plan.insert(j + 1, submit)
    with envs.make_env("assistant_3day", harness="openclaw") as env:
        _, reward, *_ , info = _play(env, plan, task=task)
    assert reward == 0.0 and info["verifier"]["goals"]["assignments_submitted_same_day"] is False
    # Stopping a day early fails too.
    plan = get_family("assistant_3day").solution(task)
    last_advance = max(k for k, a in enumerate(plan) if isinstance(a, AppCall) and a.tool == "advance_day")
    with envs.make_env("assistant_3day") as env:
        _, reward, *_ , info = _play(env, plan[:last_advance] + [Finish()], task=task)
    assert reward == 0.0 and info["verifier"]["goals"]["stopped_after_last_day"] is False


def test_answers_are_normalized():
    assert normalize_answer(" $1,200. ") == normalize_answer("1200") == "1200"
    assert normalize_answer("2026-09-10") == "2026-09-10"
    assert normalize_answer("12.50") == normalize_answer("12.5")
    assert normalize_answer("Forty") != normalize_answer("40")


# --- coding verifier -----------------------------------------------------------------------------

def _coding_run(family, seed, extra_actions, keep_plan=True):
    task = generate(family, seed)
    plan = get_family(family).solution(task) if keep_plan else [Finish()]
    with envs.make_env(family, harness="claude_code") as env:
        out = _play(env, plan[:-1] + extra_actions + [Finish()], task=task)
    return task, out


def test_hidden_tests_are_never_on_disk_during_the_episode():
    task = generate("fix_bugs_multi", 5)
    names = [n.split("::")[1].encode() for n in task.spec["hidden_names"]]
    with envs.make_env("fix_bugs_multi") as env:
        env.reset(task=task)
        env.step(env.harness.render_calls([Run("python run_tests.py")]))
        # Everything the envs package keeps on disk lives in k3-* temp dirs (sandboxes, jail support).
        tmp = Path(tempfile.gettempdir())
        for d in tmp.glob("k3-*"):
            for p in d.rglob("*"):
                if p.is_file() and not p.is_symlink():
                    data = p.read_bytes()
                    assert not any(n in data for n in names), p


def test_hidden_test_hash_is_checked():
    task = generate("fix_bug", 1)
    easy = [{**c, "setup": "", "expr": "1", "expected": ["int", 1]} for c in task.spec["hidden_cases"]]
    tampered = dataclasses.replace(task, spec={**task.spec, "hidden_cases": easy})
    plan = get_family("fix_bug").solution(task)
    with envs.make_env("fix_bug") as env:
        _, reward, *_ , info = _play(env, plan, task=tampered)
    assert reward == 0.0 and "hidden_tests_hash_mismatch_before_run" in info["verifier"]["flags"]


def test_rewriting_hidden_tests_is_impossible():
    # The submission, run by the verifier, tries to replace the hidden cases and the runner; they are
    # mounted read-only in the verifier's jail, so the real cases run and the wrong code fails.
    task = generate("write_function", 3)
    name = task.spec["snippet"]
    cheat = ("import pathlib\n"
             "for d in ('/verifier', pathlib.Path(__file__).resolve().parent.parent / 'hidden'):\n"
             "    for p in pathlib.Path(d).glob('*.*'):\n"
             "        try:\n"
             "            p.write_text('def test_ok():\\n    pass\\n')\n"
             "        except OSError:\n"
             "            pass\n\n"
             f"def {name}(*args, **kwargs):\n    return None\n")
    with envs.make_env("write_function") as env:
        _, reward, *_ , info = _play(env, [Write("solution.py", cheat), Finish()], task=task)
    assert reward == 0.0 and info["verifier"]["details"]["hidden_passed"] == 0
    assert "hack:hidden_tests_modified" not in info["verifier"]["flags"]


@pytest.mark.parametrize("cheat", [
    "class _Any:\n    def __eq__(self, other):\n        return True\n\n\ndef {name}(*args, **kwargs):\n    return _Any()\n",
    "import sys\nsys.exit(0)\n",
    "import os\nos._exit(0)\n",
])
def test_shortcuts_in_the_code_fail(cheat):
    task = generate("write_function", 8)
    name = task.spec["snippet"]
    with envs.make_env("write_function") as env:
        _, reward, *_ , info = _play(env, [Write("solution.py", cheat.format(name=name)), Finish()], task=task)
    assert reward == 0.0 and info["verifier"]["details"]["hidden_passed"] == 0


def test_planted_files_and_test_edits_are_flagged():
    _, out = _coding_run("fix_bug", 2, [Write("sitecustomize.py", "print('hi')\n")])
    assert out[1] == 0.0 and any(f.startswith("hack:planted_file") for f in out[4]["verifier"]["flags"])
    task = generate("fix_bug", 2)
    test_file = next(p for p in task.spec["files"] if p.startswith("tests/"))
    _, out = _coding_run("fix_bug", 2, [Write(test_file, "def test_nothing():\n    pass\n")])
    assert out[1] == 0.0 and out[4]["verifier"]["goals"]["hidden_tests_pass"] is True
    assert out[4]["verifier"]["unexpected_changes"] == [f"protected file changed: {test_file}"]
