"""Pause and resume: an episode cut at a random step, snapshotted and restored (here or in a fresh
process), ends with the same state, reward and trajectory as the uninterrupted one."""

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

import envs
from envs.experts import expert_policy, random_policy

ROOT = Path(__file__).resolve().parents[2]


def _actions(family, harness, seed, policy):
    """The policy's texts for one uninterrupted episode, and that episode's outcome."""
    with envs.make_env(family, harness=harness) as env:
        obs = env.reset(seed=seed)
        texts = []
        while True:
            texts.append(policy(obs))
            obs, reward, term, trunc, _ = env.step(texts[-1])
            if term or trunc:
                return texts, env.state_digest(), reward, env.trajectory()


def _replay(family, harness, texts, seed, cut):
    """Play texts[:cut], snapshot, restore into a new env, play the rest."""
    with envs.make_env(family, harness=harness) as first:
        first.reset(seed=seed)
        for t in texts[:cut]:
            first.step(t)
        blob = first.snapshot()
        assert first.snapshot() == blob  # same state, same bytes
    with envs.make_env(family, harness=harness) as second:
        second.restore(blob)
        reward = 0.0
        for t in texts[cut:]:
            _, reward, *_ = second.step(t)
        return second.state_digest(), reward, second.trajectory()


CASES = [
    ("assistant_3day", "openclaw", 3, "expert", 6),   # cuts land on different simulated days
    ("fix_bugs_multi", "codex", 2, "expert", 3),       # files edited, commands run, hidden tests
    ("gmail_reply_notion", "kimi_code", 4, "expert", 3),
    ("file_aggregate", "claude_code", 5, "random", 3),  # errors, reads, writes, random finish
    ("rename_api", "hermes", 1, "random", 2),
]


@pytest.mark.parametrize("family,harness,seed,kind,n_cuts", CASES)
def test_restore_at_random_cut_points_matches_uninterrupted(family, harness, seed, kind, n_cuts):
    policy = expert_policy(family, harness) if kind == "expert" else random_policy(harness, seed=seed)
    texts, digest, reward, record = _actions(family, harness, seed, policy)
    rng = random.Random(f"{family}/{seed}")
    cuts = sorted(rng.sample(range(len(texts)), min(n_cuts, len(texts))))
    for cut in cuts:
        d, r, rec = _replay(family, harness, texts, seed, cut)
        assert (d, r) == (digest, reward), f"cut at step {cut} of {len(texts)}"
        assert rec == record
    if kind == "expert":
        assert reward == 1.0


def test_restore_in_a_fresh_process(tmp_path):
    family, harness, seed = "assistant_3day", "hermes", 8
    texts, digest, reward, record = _actions(family, harness, seed, expert_policy(family, harness))
    cut = len(texts) // 2
    with envs.make_env(family, harness=harness) as env:
        env.reset(seed=seed)
        for t in texts[:cut]:
            env.step(t)
        (tmp_path / "episode.snap").write_bytes(env.snapshot())
    (tmp_path / "rest.json").write_text(json.dumps(texts[cut:]))
    script = f"""
import json, sys
from pathlib import Path
import envs
env = envs.make_env({family!r}, harness={harness!r})
env.restore(Path({str(tmp_path / 'episode.snap')!r}).read_bytes())
reward = 0.0
for text in json.loads(Path({str(tmp_path / 'rest.json')!r}).read_text()):
    _, reward, *_ = env.step(text)
json.dump({{"digest": env.state_digest(), "reward": reward, "record": env.trajectory()}}, sys.stdout)
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["digest"] == digest and got["reward"] == reward == 1.0
    assert got["record"] == json.loads(json.dumps(record))


def test_snapshot_of_finished_episode_and_bad_blobs():
    with envs.make_env("arith_word", harness="codex") as env:
        obs = env.reset(seed=2)
        env.step(expert_policy("arith_word", "codex")(obs))
        blob = env.snapshot()
        record = env.trajectory()
    with envs.make_env("arith_word", harness="codex") as env:
        env.restore(blob)
        assert env.done and env.trajectory() == record
        with pytest.raises(RuntimeError):
            env.step("more")
        # The env's own task-seed RNG is part of the snapshot too.
        with envs.make_env("arith_word", harness="codex") as twin:
            twin.restore(blob)
            assert twin.reset() == env.reset()
    with envs.make_env("arith_word", harness="hermes") as other:
        with pytest.raises(ValueError, match="harness"):
            other.restore(blob)
        with pytest.raises(ValueError, match="snapshot"):
            other.restore(b"not a snapshot")
