"""MOPD: the loss and estimators by hand, routing to the (domain, effort) teacher on the student's
exact ids, bad input, and a short run that resumes. Teachers are two differently seeded smoke SFT
checkpoints (the specialists are not needed to test routing and the loss)."""

from dataclasses import asdict, replace

import pytest
import torch

import envs
from k3model.config import get_profile
from k3model.engine import score
from k3model.model import K3Model
from k3model.train.common import save_state
from k3model.train.effort import EffortSpec, partition_key
from k3model.train.evaluate import evaluate
from k3model.checkpoint import load_model
from k3model.train.evaluate import evaluate_together
from k3model.train.mopd import (MOPDConfig, check_same_ids, distill_advantages, distill_step, estimator_error,
                                evaluate_routes, mopd_loss, outcome_advantages, reverse_kl_exact, rollout,
                                step_prompts, tokenizer_sha256, train)
from k3model.train.sft import SFTConfig
from k3model.train.sft import train as sft_train

# Short budgets keep an untrained model's episodes to a few dozen tokens.
SPECS = {e: EffortSpec(budget_tokens=8, length_coef=0.0, turn_tokens=4) for e in ("low", "high", "max")}
ROUTES = [(d, e) for d in envs.DOMAINS for e in ("low", "high", "max")]


def _cfg(**kw) -> MOPDConfig:
    base = dict(steps=2, episodes_per_step=3, lr=1e-3, specs=SPECS, tasks_per_route=2, log_every=1, qat=False)
    base.update(kw)
    return MOPDConfig(**base)


@pytest.fixture(scope="module")
def sft_ckpts(tmp_path_factory, demos):
    """Two smoke SFT checkpoints from one base, seeds 0 and 1 (4 steps each). The base is named so
    that the smoke context (512, shorter than a smoke-tokenized prompt) does not apply."""
    root = tmp_path_factory.mktemp("mopd")
    torch.manual_seed(0)
    model = K3Model(replace(get_profile("smoke").model, name="smoke-unbounded"))
    save_state(root / "base", model, {"config": {"model": asdict(model.cfg)}})
    out = []
    for seed in (0, 1):
        cfg = SFTConfig(profile="smoke", seed=seed, steps=4, batch_size=2, lr=3e-3, log_every=2, qat=False)
        out.append(sft_train(cfg, demos, root / f"sft{seed}", init_checkpoint=root / "base").checkpoint_dir)
    return out


def test_loss_and_advantages_by_hand():
    # Two tokens: log π_T − log π_S = (−1 − −2, −3 − −1) = (1, −2); rollout logps equal the student's
    # except token 2, whose ratio e^{ln 3} = 3 is capped at 2 (and carries no gradient).
    logp_S = torch.tensor([-2.0, -1.0], requires_grad=True)
    adv = distill_advantages(torch.tensor([-1.0, -3.0]), logp_S)
    assert adv.tolist() == [1.0, -2.0] and not adv.requires_grad
    rollout_lp = torch.tensor([-2.0, -1.0 - torch.log(torch.tensor(3.0)).item()])
    loss, stats = mopd_loss(logp_S, rollout_lp, adv, is_cap=2.0)
    # L = −(1·1 + 2·(−2)) / 2 = 1.5
    assert loss.item() == pytest.approx(1.5)
    loss.backward()
    # dL/dlogp_1 = −w·A/N = −1·1/2; token 2 is capped: no gradient.
    assert logp_S.grad.tolist() == pytest.approx([-0.5, 0.0])
    assert stats["mopd/is_capped_frac"].item() == 0.5
    # Outcome advantage: r − mean of the episode's group.
    assert outcome_advantages([1.0, 0.0, 0.0, 0.0], [0, 0, 1, 1]).tolist() == [0.5, -0.5, 0.0, 0.0]
    with pytest.raises(ValueError, match="no generated tokens"):
        mopd_loss(torch.zeros(0), torch.zeros(0), torch.zeros(0))


def test_exact_kl_and_estimator_error_by_hand():
    # π_S = (3/4, 1/4), π_T = (1/4, 3/4): KL = 3/4 ln 3 + 1/4 ln(1/3) = ln 3 / 2.
    ls, lt = torch.log(torch.tensor([[0.75, 0.25]])), torch.log(torch.tensor([[0.25, 0.75]]))
    kl = reverse_kl_exact(ls, lt)
    assert kl.item() == pytest.approx(0.5 * torch.log(torch.tensor(3.0)).item())
    # Every token drawn in proportion to π_S (3 × token 0, 1 × token 1): k1 is then exactly unbiased.
    tokens = torch.tensor([0, 0, 0, 1])
    lps, lpt = ls[0, tokens], lt[0, tokens]
    err = estimator_error(lps, lpt, kl.expand(4))
    ln3 = torch.log(torch.tensor(3.0)).item()
    assert err["kl/k1_bias"].item() == pytest.approx(0.0, abs=1e-6)
    # k1 − KL = ±ln 3 − ln3/2 → (ln3/2, ln3/2, ln3/2, −3 ln3/2): variance 3/4 · ln²3.
    assert err["kl/k1_var"].item() == pytest.approx(0.75 * ln3 ** 2, rel=1e-5)
    # k3 = (ρ − 1) − ln ρ, ρ = 1/3 (×3) and 3 (×1): mean (ln 3 − 2/3)·3/4 + (2 − ln 3)/4 = ln3/2, unbiased
    # too, with a smaller variance: 3/4 (ln3/2 − 2/3)² + 1/4 (2 − 3 ln3/2)².
    assert err["kl/k3"].item() == pytest.approx(ln3 / 2, rel=1e-5)
    assert err["kl/k3_bias"].item() == pytest.approx(0.0, abs=1e-6)
    k3_var = 0.75 * (ln3 / 2 - 2 / 3) ** 2 + 0.25 * (2 - 1.5 * ln3) ** 2
    assert err["kl/k3_var"].item() == pytest.approx(k3_var, rel=1e-5) and k3_var < 0.75 * ln3 ** 2


def test_routing_scores_the_students_own_ids_with_the_routes_teacher(sft_ckpts, smoke_tok):
    from datagen.tokenizer import EFFORT_TOKENS, special_token_ids

    student = load_model(sft_ckpts[0], qat=False)[0]
    other = load_model(sft_ckpts[1], qat=False)[0].requires_grad_(False)
    # general_tasks' teachers are the student itself (advantage and KL exactly 0), the rest the other.
    teachers = {r: (student if r[0] == "general_tasks" else other) for r in ROUTES}
    cfg = _cfg(episodes_per_step=6)
    pools = {r: envs.task_set(r[0], 2, difficulties=("easy",)) for r in ROUTES}
    prompts = step_prompts(cfg, 0, pools, ("hermes", "codex"))
    assert [p.route for p in prompts] == ROUTES[:6]
    episodes, routes, groups = rollout(student, smoke_tok, prompts, cfg, torch.Generator().manual_seed(0))
    assert routes == ROUTES[:6] and all(ep.n_generated > 0 for ep in episodes)
    specials = special_token_ids(smoke_tok)
    effort_ids = {e: specials[t] for e, t in EFFORT_TOKENS.items()}
    _, stats = distill_step(student, teachers, episodes, routes, groups, cfg, effort_ids, "cpu")
    for r in ROUTES[:3]:
        assert stats[f"kl/{r[0]}/{r[1]}"].item() == pytest.approx(0.0, abs=1e-6)
    # The other routes' KL is the other teacher's; its sampled estimate is what engine.score gives.
    k1 = []
    for ep, r in zip(episodes, routes):
        gen = [t for t, g in enumerate(ep.generated) if g]
        lt = score(other if r[0] != "general_tasks" else student, [ep.token_ids], [gen[0]])[0]
        ls = score(student, [ep.token_ids], [gen[0]])[0]
        k1 += [ls[t - gen[0]] - lt[t - gen[0]] for t in gen]
    assert stats["kl/k1"].item() == pytest.approx(sum(k1) / len(k1), abs=1e-4)
    for r in ROUTES[3:6]:
        assert stats[f"kl/{r[0]}/{r[1]}"].item() > 1e-4


def test_the_teacher_must_see_the_sampled_ids(smoke_tok):
    from datagen.tokenizer import EFFORT_TOKENS, special_token_ids
    from k3model.train.rollout import Episode
    specials = special_token_ids(smoke_tok)
    effort_ids = {e: specials[t] for e, t in EFFORT_TOKENS.items()}
    ep = Episode()
    ep.append([1, 4, effort_ids["low"], 300, 301], generated=False)
    ep.append([302, 303], generated=True)
    ids = torch.tensor([ep.token_ids])
    check_same_ids(ids, [ep], effort_ids, ["low"])
    shifted = ids.clone()
    shifted[0, 4] = 299  # one re-tokenized prompt id
    with pytest.raises(AssertionError, match="other token ids"):
        check_same_ids(shifted, [ep], effort_ids, ["low"])
    with pytest.raises(AssertionError, match="effort token"):
        check_same_ids(ids, [ep], effort_ids, ["max"])  # routed to max, prompted at low


def test_bad_input_is_named(sft_ckpts, smoke_tok, tmp_path):
    teachers = {r: sft_ckpts[1] for r in ROUTES}
    missing = {r: c for r, c in teachers.items() if r != ("coding_agents", "high")}
    with pytest.raises(ValueError, match=r"coding_agents\|high"):
        train(_cfg(), sft_ckpts[0], missing, smoke_tok, tmp_path / "a")
    # A teacher with another vocabulary.
    torch.manual_seed(0)
    wide = K3Model(replace(get_profile("smoke").model, name="smoke-unbounded", vocab_size=640))
    save_state(tmp_path / "wide", wide, {"config": {"model": asdict(wide.cfg)}})
    with pytest.raises(ValueError, match="vocabulary of 640"):
        train(_cfg(), sft_ckpts[0], {**teachers, ("general_agents", "max"): tmp_path / "wide"}, smoke_tok, tmp_path / "b")
    # A teacher that records another tokenizer (same vocabulary size).
    narrow = K3Model(replace(get_profile("smoke").model, name="smoke-unbounded"))
    save_state(tmp_path / "othertok", narrow, {"config": {"model": asdict(narrow.cfg)},
                                               "data_versions": {"tokenizer_sha256": "0" * 64}})
    with pytest.raises(ValueError, match="tokenizer"):
        train(_cfg(), sft_ckpts[0], {**teachers, ("general_tasks", "low"): tmp_path / "othertok"}, smoke_tok,
              tmp_path / "c")
    # An effort the student's SFT data never held: build a low/high-only student manifest.
    from k3model.checkpoint import load_checkpoint
    weights, manifest = load_checkpoint(sft_ckpts[0])
    manifest["config"]["data"]["config"]["efforts"] = ["low", "high"]
    student = K3Model(replace(get_profile("smoke").model, name="smoke-unbounded"))
    student.load_state_dict(weights)
    save_state(tmp_path / "lowhigh", student, {"config": manifest["config"]})
    with pytest.raises(ValueError, match=r"never trained on effort\(s\) \['max'\]"):
        train(_cfg(), tmp_path / "lowhigh", teachers, smoke_tok, tmp_path / "d")
    assert len(tokenizer_sha256(smoke_tok)) == 64


def test_a_short_run_learns_toward_its_teachers_and_resumes(sft_ckpts, smoke_tok, tmp_path):
    teachers = {r: sft_ckpts[1] for r in ROUTES}
    cfg = _cfg(steps=3, ckpt_every=1)
    full = train(cfg, sft_ckpts[0], teachers, smoke_tok, tmp_path / "full")
    assert [h["step"] for h in full.history] == [1, 2, 3]
    assert full.teacher_manifest[partition_key(ROUTES[0])]["sha256"]
    assert set(full.teacher_manifest) == {partition_key(r) for r in ROUTES}
    assert full.flops["total"] == pytest.approx(full.flops["forward"] + full.flops["train"])
    # Training passes: forward + backward over the student's rows; forwards: its rollouts, the teacher.
    assert full.flops["train"] > full.flops["forward"] / 2 > 0
    for h in full.history:
        assert h["kl/exact"] > 0 and torch.isfinite(torch.tensor(h["train/loss"]))
    # Killed after one step and called again: the same history and weights as the uninterrupted run.
    train(cfg, sft_ckpts[0], teachers, smoke_tok, tmp_path / "resumed", stop_after=1)
    again = train(cfg, sft_ckpts[0], teachers, smoke_tok, tmp_path / "resumed")
    assert again.resumed_from_step == 1
    strip = [{k: v for k, v in h.items() if not k.startswith("perf/")} for h in again.history]
    assert strip == [{k: v for k, v in h.items() if not k.startswith("perf/")} for h in full.history]
    from k3model.checkpoint import load_checkpoint
    w1, m1 = load_checkpoint(full.checkpoint_dir)
    w2, _ = load_checkpoint(again.checkpoint_dir)
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    assert m1["data_versions"]["tokenizer_sha256"] == tokenizer_sha256(smoke_tok)


def test_routes_evaluated_together_score_as_one_evaluate_per_route(sft_ckpts, smoke_tok):
    """evaluate_routes batches each effort's routes into one decode: every route's figures equal
    evaluate() on that route alone (the engine is batch invariant), timing aside."""
    model = load_model(sft_ckpts[0])[0].eval()
    specs = {"low": EffortSpec(budget_tokens=12, length_coef=0.0, turn_tokens=6),
             "high": EffortSpec(budget_tokens=20, length_coef=0.0, turn_tokens=10)}
    tasks = {(d, e): envs.task_set(d, 2, seed=7) for d in envs.DOMAINS for e in specs}
    together = evaluate_routes(model, smoke_tok, tasks, specs)
    assert list(together) == list(tasks)
    timing = ("seconds", "policy_tokens_per_s")
    for route, ts in tasks.items():
        alone = evaluate(model, smoke_tok, ts, route[1], specs=specs).as_metadata()
        got = together[route].as_metadata()
        assert {k: v for k, v in got.items() if k not in timing} == {k: v for k, v in alone.items() if k not in timing}
        assert got["n"] == 2 and got["mean_policy_tokens"] > 0
    # Capped batches (ladder.evaluate_policy passes its plan's cap) split an effort's episodes
    # into several decodes: still the same figures.
    capped = evaluate_together(model, smoke_tok, {r: (ts, r[1], None) for r, ts in tasks.items()}, specs,
                               max_episodes_per_batch=4)
    for route in tasks:
        assert ({k: v for k, v in capped[route].as_metadata().items() if k not in timing}
                == {k: v for k, v in together[route].as_metadata().items() if k not in timing})
    # Named harnesses too (cross_harness: in-harness and held-out in one batch).
    calls = {"in": (tasks[("general_agents", "low")], "low", ["codex", "hermes"]),
             "out": (tasks[("general_agents", "low")], "low", ["openclaw"])}
    for name, report in evaluate_together(model, smoke_tok, calls, specs).items():
        ts, effort, harness = calls[name]
        alone = evaluate(model, smoke_tok, ts, effort, harness=harness, specs=specs).as_metadata()
        assert ({k: v for k, v in report.as_metadata().items() if k not in timing}
                == {k: v for k, v in alone.items() if k not in timing})
    with pytest.raises(ValueError, match="no budget for effort 'max'"):
        evaluate_routes(model, smoke_tok, {("general_tasks", "max"): tasks[("general_tasks", "low")]}, specs)
