"""The starter families (envs/tasks/starter.py): real verifiers that a random, empty or nearly-right
policy cannot pass, and the adversarial battery on the coding one."""

import pytest

import envs
from envs.actions import AppCall, Finish, Write
from envs.adversarial import ATTACKS, host, run_attack
from envs.experts import random_policy
from envs.rollout import rollout
from envs.tasks import generate, get_family
from envs.tasks.starter import FAMILIES, PING_PHRASINGS, WORDS, WRITE_PHRASINGS, grid_point

STARTERS = [f.name for f in FAMILIES]


def _play(family, actions, task, harness="codex"):
    with envs.make_env(family, harness=harness) as env:
        env.reset(task=task)
        for i, a in enumerate(actions):
            obs, reward, terminated, truncated, info = env.step(env.harness.render_calls([a], start_index=i))
            if terminated or truncated:
                return reward, info
    raise AssertionError("the episode did not end")


@pytest.mark.parametrize("family", STARTERS)
def test_random_and_empty_policies_score_zero(family):
    for seed in range(12):
        harness = envs.HARNESSES[seed % len(envs.HARNESSES)]
        with envs.make_env(family, harness=harness) as env:
            assert rollout(env, random_policy(harness, seed), seed=seed)["reward"] == 0.0
        with envs.make_env(family, harness=harness) as env:
            env.reset(seed=seed)
            _, r, *_ = env.step("")  # no call at all
            assert r == 0.0 and not env.done
    medium = ("compare_numbers_close", "slack_ping_pick")
    assert get_family(family).info()["difficulty"] == ("medium" if family in medium else "easy")


def test_nearly_right_answers_fail():
    for seed in range(6):
        t = generate("echo_word", seed)
        other = next(w for w in WORDS if w != t.spec["answer"])
        assert _play("echo_word", [Finish(other)], t)[0] == 0.0
        assert _play("echo_word", [Finish(t.spec["answer"].upper())], t)[0] == 1.0  # case is normalized
        for family in ("compare_numbers", "compare_numbers_close"):
            t = generate(family, seed)
            a, b = t.spec["numbers"]
            wrong = min(a, b) if t.spec["larger"] else max(a, b)
            assert _play(family, [Finish(str(wrong))], t)[0] == 0.0
            assert _play(family, [Finish(f"{a} or {b}")], t)[0] == 0.0
            assert _play(family, [Finish(str(max(a, b) if t.spec["larger"] else min(a, b)))], t)[0] == 1.0
    t = generate("slack_ping", 1)
    others = [c for c in t.spec["world"]["slack"]["channels"] if c["name"] != t.spec["channel"]]
    wrong_channel = AppCall("slack", "post", {"channel": others[0]["name"], "text": t.spec["text"]})
    right = AppCall("slack", "post", {"channel": t.spec["channel"], "text": t.spec["text"]})
    assert _play("slack_ping", [wrong_channel, Finish()], t)[0] == 0.0
    assert _play("slack_ping", [right, right, Finish()], t)[0] == 0.0  # posted twice
    assert _play("slack_ping", [right, Finish()], t)[0] == 1.0
    for seed in range(6):  # slack_ping_pick: the other of the two words fails, the asked one passes
        t = generate("slack_ping_pick", seed)
        a, b = t.spec["words"]
        other = b if t.spec["text"] == a else a
        which = "first" if t.spec["text"] == a else "second"
        assert a != b and f'"{a}"' in t.instruction and f'"{b}"' in t.instruction and which in t.instruction
        post = lambda text: AppCall("slack", "post", {"channel": t.spec["channel"], "text": text})  # noqa: E731
        assert _play("slack_ping_pick", [post(other), Finish()], t)[0] == 0.0
        assert _play("slack_ping_pick", [post(f"{a} {b}"), Finish()], t)[0] == 0.0
        assert _play("slack_ping_pick", [post(t.spec["text"]), Finish()], t)[0] == 1.0
    for seed in range(3):
        t = generate("write_constant", seed)
        src = t.spec["source"]
        k = int(src.rsplit(" ", 1)[-1])
        off_by_one = src.rsplit(" ", 1)[0] + f" {k + 1}\n"
        reward, info = _play("write_constant", [Write("solution.py", off_by_one), Finish()], t)
        assert reward == 0.0 and info["verifier"]["details"]["hidden_passed"] < info["verifier"]["details"]["hidden_total"]


def test_compare_numbers_close_shares_the_leading_digits():
    """The hard split of compare_numbers: same question, the hundreds shared, half the time the tens."""
    tasks = [generate("compare_numbers_close", 500_000 + s) for s in range(400)]
    pairs = [t.spec["numbers"] for t in tasks]
    assert all(100 <= a <= 999 and 100 <= b <= 999 and a != b and a // 100 == b // 100 for a, b in pairs)
    same_tens = sum(a // 10 == b // 10 for a, b in pairs) / len(pairs)
    assert 0.4 < same_tens < 0.65  # half by construction, plus the rest's ~1 % chance
    assert len({t.instruction for t in tasks}) >= 390  # random pairs: a few repeat (the scorer keeps distinct ones)
    assert tasks[0].instruction.startswith("Which number is")


def test_write_number_takes_exactly_answer_returning_the_number():
    for seed in (7,):
        t = generate("write_number", seed)
        k = t.spec["number"]
        assert str(k) in t.instruction and 100 <= k <= 999
        assert _play("write_number", get_family("write_number").solution(t), t, harness="claude_code")[0] == 1.0
        near = [f"def answer():\n    return {k + 1}\n",  # off by one
                f"def answer():\n    return '{k}'\n",  # the digits, as text
                f"def value():\n    return {k}\n",  # write_constant's other names
                f"def answer(x):\n    return {k}\n",  # the argument of write_constant's other kinds
                f"def answer():\n    print({k})\n",
                f"answer = {k}\n"]
        for src in near:
            reward, info = _play("write_number", [Write("solution.py", src), Finish()], t)
            assert reward == 0.0 and info["verifier"]["details"]["hidden_passed"] == 0, src
        # The right function in another file, or no file at all, earns nothing either.
        assert _play("write_number", [Write("answer.py", t.spec["source"]), Finish()], t)[0] == 0.0
        assert _play("write_number", [Finish()], t)[0] == 0.0
    # Three digits drawn per seed: a fixed guess passes at most 2 % of the tasks.
    numbers = [generate("write_number", s).spec["number"] for s in range(300)]
    assert max(numbers.count(k) for k in set(numbers)) <= 6 and len(set(numbers)) > 200


def test_write_answer_is_write_constant_named_answer():
    wa, wc = get_family("write_answer"), get_family("write_constant")
    kinds = set()
    for seed in range(40):
        t = generate("write_answer", seed)
        assert " answer(" in t.instruction and t.spec["hidden_cases"][0]["setup"] == "from solution import answer"
        kinds.add(t.spec["source"].split("return ")[1].split()[1] if " x " in t.spec["source"] else "constant")
    assert kinds == {"constant", "+", "*"}  # write_constant's three kinds, only the name fixed
    t = generate("write_answer", 0)
    assert _play("write_answer", wa.solution(t), t)[0] == 1.0
    # The right body under write_constant's other names fails the hidden test's import.
    reward, info = _play("write_answer", [Write("solution.py", t.spec["source"].replace("answer", "value")), Finish()], t)
    assert reward == 0.0 and info["verifier"]["details"]["hidden_passed"] == 0
    assert wc.names != wa.names and wa.verify.__func__ is wc.verify.__func__  # the same verifier


# The rungs the tiny ladder selects for general_agents and coding_agents: a specialist is scored on
# ≥ 256 held-out tasks whose instructions differ from its ≥ 256 RL prompts (k3model.train.ladder).
WIDENED = ("slack_ping", "slack_ping_pick", "write_constant", "write_answer")


@pytest.mark.parametrize("family", WIDENED)
def test_512_seeds_give_512_distinct_instructions(family):
    assert len({generate(family, s).instruction for s in range(512)}) >= 512
    # Held-out seeds (the ladder's EVAL_SEED_BASE = 500,000 on) hold ≥ 256 instructions no RL seed
    # 0–255 has: the 256 prompts take 256 of the grid's cells, whichever seeds they come from.
    rl = {generate(family, s).instruction for s in range(256)}
    held = {generate(family, 500_000 + s).instruction for s in range(768)}
    assert len(held - rl) >= 256


def test_grid_point_visits_every_cell_once_per_period():
    sizes = (3, 4, 5)
    cells = [grid_point("t", s, sizes) for s in range(60)]
    assert len(set(cells)) == 60  # every cell once in N = 60 consecutive seeds
    assert all(0 <= a < 3 and 0 <= b < 4 and 0 <= c < 5 for a, b, c in cells)
    assert [grid_point("t", s + 60, sizes) for s in range(60)] == cells  # period N
    assert [grid_point("u", s, sizes) for s in range(60)] != cells  # the salt picks the order
    with pytest.raises(ValueError, match="≥ 1 per axis"):
        grid_point("t", 0, (3, 0))


def test_every_phrasing_names_the_parts_and_the_expert_passes_it():
    from envs.experts import WORDS as RANDOM_WORDS
    # The random policy's strings are no task word: a random post never carries the text.
    assert not (set(RANDOM_WORDS) | {"m0001", "n0001", "c101", "a001", "general", "hello"}) & set(WORDS)
    seen = {}
    for seed in range(200):
        t = generate("slack_ping", seed)
        assert f'"{t.spec["text"]}"' in t.instruction and f"#{t.spec['channel']}" in t.instruction
        assert t.spec["text"] in WORDS
        assert t.spec["channel"] in {c["name"] for c in t.spec["world"]["slack"]["channels"]}
        seen.setdefault(next(i for i, p in enumerate(PING_PHRASINGS)
                             if t.instruction == p.format(word=t.spec["text"], channel=t.spec["channel"])), t)
    assert sorted(seen) == list(range(len(PING_PHRASINGS)))
    for i, t in seen.items():
        right = AppCall("slack", "post", {"channel": t.spec["channel"], "text": t.spec["text"]})
        other = next(w for w in WORDS if w != t.spec["text"])
        assert _play("slack_ping", [right, Finish()], t)[0] == 1.0, PING_PHRASINGS[i]
        assert _play("slack_ping", [AppCall("slack", "post", {"channel": t.spec["channel"], "text": other}),
                                    Finish()], t)[0] == 0.0
    said = {}
    for seed in range(60):
        t = generate("write_answer", seed)
        sig = t.spec["source"].split("\n")[0].removeprefix("def ").removesuffix(":")
        said.setdefault(next(i for i, p in enumerate(WRITE_PHRASINGS) if p.split("{")[0] in t.instruction
                             and f" {sig}" in t.instruction), t)
    assert sorted(said) == list(range(len(WRITE_PHRASINGS)))
    for t in said.values():
        assert _play("write_answer", get_family("write_answer").solution(t), t)[0] == 1.0


@pytest.fixture(scope="module")
def h():
    with host() as hst:
        yield hst


# One attack of each kind on the starter coding family (the full battery runs on write_function).
KINDS = list({a.kind: a for a in ATTACKS}.values())


@pytest.mark.parametrize("attack", KINDS, ids=[a.kind for a in KINDS])
def test_attacks_on_write_constant_earn_nothing_and_stay_inside(attack, h):
    r = run_attack(attack, h, family="write_constant")
    assert r.reward == 0.0 and r.escapes == [], r.outputs


# write_number's one hidden case compares a value: an object equal to everything, or a submission
# that ends the verifier's process before the comparison, must not pass it.
@pytest.mark.parametrize("cheat", [
    "class _Any:\n    def __eq__(self, other):\n        return True\n\n\ndef answer():\n    return _Any()\n",
    "import os\nos._exit(0)\n",
])
def test_shortcuts_on_write_number_fail(cheat):
    t = generate("write_number", 4)
    reward, info = _play("write_number", [Write("solution.py", cheat), Finish()], t)
    assert reward == 0.0 and info["verifier"]["details"]["hidden_passed"] == 0
