"""k3model.train.muon: Newton–Schulz against a plain reference on fresh inputs, one head's block at a
time, the AdamW side equal to torch's AdamW, matched update RMS, refusals, exact resume, and (on a GPU)
the captured step."""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import pytest
import torch
import torch.nn as nn

from k3model.config import MLAConfig, get_profile
from k3model.mla import GatedMLA, causal_max_logit
from k3model.model import K3Model
from k3model.train.common import (CapturedStep, attention_logits, build_optimizer, save_state,
                                  track_max_logits)
from k3model.train.muon import (NS_COEFFICIENTS, PerHeadMuon, build_muon, from_blocks, muon_layouts,
                                newton_schulz, to_blocks)


def _reference_ns(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Keller Jordan's quintic iteration, one fp64 matrix at a time, written out."""
    a, b, c = NS_COEFFICIENTS
    x = g.double()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / max(float(x.norm()), 1e-7)
    for _ in range(steps):
        A = x @ x.T
        B = b * A + c * A @ A
        x = a * x + B @ x
    return x.T if tall else x


def _model(seed: int = 0) -> K3Model:
    torch.manual_seed(seed)
    return K3Model(replace(get_profile("smoke").model, vision=None))


def _batches(model: K3Model, n: int, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, model.cfg.vocab_size, (2, 32), generator=g) for _ in range(n)]


def _train(model, opt, batches):
    for ids in batches:
        opt.zero_grad(set_to_none=True)
        model.compute_loss(ids)["loss/total"].backward()
        opt.step()


@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 12, 40), (2, 40, 12), (4, 1, 7), (1, 63, 100)])
def test_newton_schulz_matches_reference_on_fresh_inputs(shape):
    for seed in range(3):
        g = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 10 ** (seed - 1)
        out = newton_schulz(g)
        assert out.shape == g.shape and out.dtype == g.dtype
        for i in range(shape[0]):
            torch.testing.assert_close(out[i].double(), _reference_ns(g[i]), rtol=1e-4, atol=1e-5)
        # Approximately orthogonal: singular values in Keller Jordan's ≈ [0.7, 1.2] band (not exactly 1).
        s = torch.linalg.svdvals(out.double())
        if min(shape[1:]) > 1:
            assert float(s.min()) > 0.5 and float(s.max()) < 1.3, s


def test_newton_schulz_agrees_with_torch_muon_in_bf16():
    from torch.optim._muon import _zeropower_via_newtonschulz
    g = torch.randn(24, 56, generator=torch.Generator().manual_seed(7))
    ours = newton_schulz(g.unsqueeze(0), dtype=torch.bfloat16)[0].float()
    theirs = _zeropower_via_newtonschulz(g, NS_COEFFICIENTS, 5, 1e-7).float()
    # Both run the same iteration in bf16; only the order of bf16 roundings differs.
    assert float((ours - theirs).abs().max()) < 0.05
    assert float((ours.double() - _reference_ns(g)).abs().max()) < 0.05


@pytest.mark.parametrize("layout", ["rows:4", "cols:4", "whole", "stack"])
def test_blocks_round_trip(layout):
    w = torch.randn(3, 8, 12) if layout == "stack" else torch.randn(8, 12)
    blocks = to_blocks(w, layout)
    assert torch.equal(from_blocks(blocks, layout, w.shape), w)
    if layout == "cols:4":
        assert torch.equal(blocks[1], w[:, 3:6])
    if layout == "rows:4":
        assert torch.equal(blocks[1], w[2:4])


@pytest.mark.parametrize("layout", ["rows:4", "cols:4"])
def test_each_head_is_orthogonalised_on_its_own(layout):
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(16, 24))
    lr = 0.01
    opt = PerHeadMuon([{"kind": "muon", "params": [w], "layouts": [layout]}], lr=lr, weight_decay=0.0, momentum=0.0)
    w0 = w.detach().clone()
    grad = torch.randn(16, 24)
    w.grad = grad.clone()
    opt.step()
    delta_blocks = to_blocks((w.detach() - w0), layout)
    grad_blocks = to_blocks(grad, layout)
    for h in range(4):
        block = grad_blocks[h]
        expected = -lr * 0.2 * math.sqrt(max(block.shape)) * _reference_ns(block)
        torch.testing.assert_close(delta_blocks[h].double(), expected, rtol=1e-4, atol=1e-7)
        # Update RMS matched to AdamW's: 0.2·lr up to NS's approximate singular values.
        rms = float(delta_blocks[h].pow(2).mean().sqrt()) / lr
        assert 0.14 < rms < 0.26, rms
    # One head's huge gradient does not shrink the others' step (it would for a whole-matrix update).
    w2 = nn.Parameter(w0.clone())
    opt2 = PerHeadMuon([{"kind": "muon", "params": [w2], "layouts": [layout]}], lr=lr, weight_decay=0.0,
                       momentum=0.0)
    loud = grad.clone()
    to_blocks(loud, layout)[0].mul_(1000)
    w2.grad = loud
    opt2.step()
    torch.testing.assert_close(to_blocks(w2.detach() - w0, layout)[1:], delta_blocks[1:], rtol=1e-4, atol=1e-8)


def test_decoupled_weight_decay():
    w = nn.Parameter(torch.randn(8, 8))
    w0 = w.detach().clone()
    opt = PerHeadMuon([{"kind": "muon", "params": [w], "layouts": ["whole"]}], lr=0.1, weight_decay=0.5)
    w.grad = torch.zeros(8, 8)  # a zero gradient: NS of zero is zero, only the decay acts
    opt.step()
    torch.testing.assert_close(w.detach(), w0 * (1 - 0.1 * 0.5))


def test_layouts_follow_the_heads_and_keep_embeddings_gates_and_vectors_on_adamw():
    model = K3Model(get_profile("smoke").model)
    layouts = muon_layouts(model)
    params = dict(model.named_parameters())
    mla = next(n for n, m in model.named_modules() if type(m).__name__ == "GatedMLA")
    H = model.cfg.mla_heads
    assert layouts[f"{mla}.q_proj.weight"] == f"rows:{H}"
    assert layouts[f"{mla}.kv_up.weight"] == f"rows:{H}"
    assert layouts[f"{mla}.o_proj.weight"] == f"cols:{H}"
    assert layouts[f"{mla}.kv_down.weight"] == "whole"
    assert any(v == "stack" for v in layouts.values())  # routed experts, one matrix each
    for name in ("embed.weight", "lm_head.weight", "vision.pos_embed", "vision.patch_embed.weight"):
        assert name in params and name not in layouts
    assert not [n for n in layouts if params[n].dim() < 2 or ".router." in n or "conv" in n
                or ".b_proj." in n or ".f_down." in n or ".f_up." in n]


def test_muon_refuses_embeddings_and_vectors_naming_them():
    model = _model()
    with pytest.raises(ValueError, match=r"embed\.weight.*embedding"):
        build_muon(model, 1e-3, 0.1, muon_names=["layers.0.mixer.q_proj.weight", "embed.weight"])
    with pytest.raises(ValueError, match=r"final_norm\.weight.*1-D"):
        build_muon(model, 1e-3, 0.1, muon_names=["final_norm.weight"])
    with pytest.raises(ValueError, match="no parameter named"):
        build_muon(model, 1e-3, 0.1, muon_names=["nope.weight"])
    with pytest.raises(ValueError, match="optimizer must be one of"):
        build_optimizer(model, 1e-3, 0.1, optimizer="sgd")


def test_adamw_side_equals_torch_adamw():
    """The parameters Muon does not take follow torch's fused AdamW exactly (same groups, same kernel)."""
    a, b = _model(), _model()
    batches = _batches(a, 3)
    muon = build_optimizer(a, 3e-3, 0.1, optimizer="muon")
    layouts = muon_layouts(b)
    # b: only the AdamW side trains, with torch's AdamW; its Muon matrices stay fixed, so compare after
    # one step (from the same weights and gradient, the AdamW parameters must agree exactly).
    rest = [(n, p) for n, p in b.named_parameters() if n not in layouts]
    adamw = torch.optim.AdamW([{"params": [p for _, p in rest if p.dim() >= 2], "weight_decay": 0.1},
                               {"params": [p for _, p in rest if p.dim() < 2], "weight_decay": 0.0}],
                              lr=3e-3, betas=(0.9, 0.95), fused=True)
    _train(a, muon, batches[:1])
    _train(b, adamw, batches[:1])
    pa = dict(a.named_parameters())
    for n, p in rest:
        assert torch.equal(pa[n], p), n
    moved = [n for n in layouts if not torch.equal(pa[n], dict(b.named_parameters())[n])]
    assert len(moved) == len(layouts)  # and Muon moved every matrix it holds


def test_exact_resume_through_a_checkpoint(tmp_path):
    from k3model.checkpoint import load_resume_state
    from k3model.train.common import restore_train_state
    batches = _batches(_model(), 6)
    full = _model()
    opt = build_optimizer(full, 3e-3, 0.1, optimizer="muon")
    _train(full, opt, batches)

    first = _model()
    opt1 = build_optimizer(first, 3e-3, 0.1, optimizer="muon")
    _train(first, opt1, batches[:3])
    save_state(tmp_path / "last", first, {}, opt1, step=3)
    weights, state = load_resume_state(tmp_path / "last")
    second = _model(seed=123)  # other weights: everything must come from the checkpoint
    second.load_state_dict(weights)
    opt2 = build_optimizer(second, 3e-3, 0.1, optimizer="muon")
    restore_train_state(state, opt2)
    assert any("momentum_buffer" in s for s in opt2.state.values())
    _train(second, opt2, batches[3:])
    for (n, p0), p1 in zip(full.named_parameters(), second.parameters()):
        assert torch.equal(p0, p1), n


def test_muon_trains_the_smoke_model():
    model = _model()
    opt = build_optimizer(model, 3e-3, 0.1, optimizer="muon")
    ids = _batches(model, 1)[0]
    first = float(model.compute_loss(ids)["loss/total"])
    _train(model, opt, [ids] * 8)
    assert float(model.compute_loss(ids)["loss/total"]) < first - 0.5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need CUDA")
@pytest.mark.parametrize("compiled", [False, True], ids=["eager-modules", "compiled-regions"])
def test_captured_muon_step_equals_eager(compiled):
    cfg = replace(get_profile("smoke").model, vision=None, mtp_depth=0, activation_checkpointing=False)
    torch.manual_seed(0)
    eager = K3Model(cfg).cuda().train()
    graphed = copy.deepcopy(eager)
    if compiled:
        from k3model.compiled import compile_regions

        compile_regions(eager, dynamic=True)
        compile_regions(graphed, dynamic=True)
    opts = [build_muon(m, 1e-3, 0.1, capturable=True) for m in (eager, graphed)]
    for m in (eager, graphed):
        track_max_logits(m)

    def step_of(model, opt):
        def step(ids):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model.compute_loss(ids)["loss/total"]
            loss.backward()
            opt.step()
            for layer in model.moe_layers():
                layer.update_bias()
            # The monitor and QK-Clip inside the graph too, at a τ below the smoke model's logits (it fires).
            clipped = attention_logits(model, qk_clip_tau=0.01)["attn/qk_clipped_heads"]
            return torch.stack([loss.detach().float(), clipped.float()])
        return step

    batches = [torch.randint(0, cfg.vocab_size, (4, 64), device="cuda") for _ in range(4)]
    eager_step = step_of(eager, opts[0])
    eager_all = [eager_step(b).clone() for b in [batches[0], batches[0], *batches[1:]]]
    eager_losses = eager_all[2:]
    captured = CapturedStep(step_of(graphed, opts[1]), batches[0], warmup=2, optimizer=opts[1])
    graphed_losses = [captured(b).clone() for b in batches[1:]]
    torch.cuda.synchronize()
    torch.testing.assert_close(torch.stack(graphed_losses), torch.stack(eager_losses), rtol=1e-4, atol=1e-4)
    assert len({float(x[0]) for x in graphed_losses}) == 3  # three batches, three losses
    # The clip fired (in the first step at least: after it the heads' logits sit at about τ) and the
    # replays clipped the heads the eager steps clipped.
    assert float(eager_all[0][1]) > 0
    assert [float(x[1]) for x in graphed_losses] == [float(x[1]) for x in eager_losses]
    for (name, p0), p1 in zip(eager.named_parameters(), graphed.parameters()):
        torch.testing.assert_close(p1, p0, rtol=1e-3, atol=1e-4, msg=name)
    print("captured Muon: losses", [x.tolist() for x in graphed_losses])


# ----------------------------------------------------------------------------------------------
# Max-logit monitor and QK-Clip (k3model/mla.py)



def test_causal_max_logit_equals_brute_force():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 37, 8, generator=g), torch.randn(2, 3, 37, 8, generator=g)
    scores = (q @ k.transpose(-1, -2)) * 0.5
    scores = scores.masked_fill(torch.ones(37, 37, dtype=torch.bool).triu(1), float("-inf"))
    expected = scores.amax(dim=(0, 2, 3))
    torch.testing.assert_close(causal_max_logit(q, k, 0.5, chunk=8), expected)
    torch.testing.assert_close(causal_max_logit(q, k, 0.5, chunk=1000), expected)
    # A future key with a huge logit is not counted.
    k2 = k.clone()
    k2[:, :, -1] = q[:, :, 0] * 100
    torch.testing.assert_close(causal_max_logit(q, k2, 0.5)[0], torch.maximum(
        expected[0], (q[:, 0, -1] @ k2[:, 0, -1].T).diagonal().max() * 0.5))


@pytest.mark.parametrize("q_rank", [None, 24])
def test_qk_clip_fires_on_a_planted_explosion_and_fixes_it(q_rank):
    torch.manual_seed(0)
    cfg = MLAConfig(d_model=32, n_heads=4, q_rank=q_rank, kv_rank=16, qk_nope_dim=8, qk_rope_dim=4, v_head_dim=8)
    mla = GatedMLA(cfg).train()
    mla.track_max_logit = True
    x = torch.randn(2, 19, 32)
    mla(x)
    before = mla.max_logit_H.clone()
    # Plant: head 2's queries grow 40× (as a blown-up W_q would after unchecked updates).
    w_q = (mla.q_proj if q_rank is None else mla.q_up).weight
    with torch.no_grad():
        w_q.view(4, 12, -1)[2] *= 40.0
    mla(x)
    exploded = mla.max_logit_H.clone()
    tau = float(before.max()) * 2
    assert float(exploded[2]) > 5 * tau and bool((exploded[[0, 1, 3]] < tau).all())
    saved = {n: p.detach().clone() for n, p in mla.named_parameters()}
    assert int(mla.qk_clip_(tau)) == 1
    mla(x)
    after = mla.max_logit_H
    torch.testing.assert_close(after[2], torch.tensor(tau), rtol=1e-4, atol=0)  # back to exactly τ
    torch.testing.assert_close(after[[0, 1, 3]], exploded[[0, 1, 3]], rtol=0, atol=0)
    # The MLA split: head 2's q_nope and k_nope rows by √γ, its q_rope rows by γ, the shared k_rope
    # (kv_down) and the values untouched; other heads untouched.
    gamma = tau / float(exploded[2])
    q_name = "q_proj.weight" if q_rank is None else "q_up.weight"
    q_new, q_old = dict(mla.named_parameters())[q_name].view(4, 12, -1), saved[q_name].view(4, 12, -1)
    torch.testing.assert_close(q_new[2, :8], q_old[2, :8] * math.sqrt(gamma))
    torch.testing.assert_close(q_new[2, 8:], q_old[2, 8:] * gamma)
    assert torch.equal(q_new[[0, 1, 3]], q_old[[0, 1, 3]])
    kv_new, kv_old = mla.kv_up.weight.view(4, 16, -1), saved["kv_up.weight"].view(4, 16, -1)
    torch.testing.assert_close(kv_new[2, :8], kv_old[2, :8] * math.sqrt(gamma))
    assert torch.equal(kv_new[2, 8:], kv_old[2, 8:]) and torch.equal(kv_new[[0, 1, 3]], kv_old[[0, 1, 3]])
    for name in ("kv_down.weight", "g_proj.weight", "o_proj.weight"):
        assert torch.equal(dict(mla.named_parameters())[name], saved[name]), name
    # Below τ everywhere now: a second clip changes nothing.
    assert int(mla.qk_clip_(tau * 1.001)) == 0


def test_qk_clip_refuses_a_non_positive_tau():
    mla = GatedMLA(MLAConfig(d_model=32, n_heads=4, q_rank=None, kv_rank=16, qk_nope_dim=8, qk_rope_dim=4,
                             v_head_dim=8)).train()
    mla.track_max_logit = True
    mla(torch.randn(1, 5, 32))
    for tau in (0.0, -1.0):
        with pytest.raises(ValueError, match="tau must be > 0"):
            mla.qk_clip_(tau)
        with pytest.raises(ValueError, match="qk_clip_tau must be > 0"):
            attention_logits(mla, tau)
    from k3model.train.pretrain import PretrainConfig
    with pytest.raises(ValueError, match="qk_clip_tau"):
        PretrainConfig(qk_clip_tau=0.0)


def test_every_mla_head_is_logged_from_a_model_forward():
    model = _model()
    track_max_logits(model)
    model.train()
    model.compute_loss(_batches(model, 1)[0])["loss/total"].backward()
    metrics = attention_logits(model, qk_clip_tau=1e6)
    mlas = [n for n, m in model.named_modules() if isinstance(m, GatedMLA)]
    per_head = [k for k in metrics if k.startswith("attn/max_logit/")]
    assert len(per_head) == len(mlas) * model.cfg.mla_heads and mlas
    assert float(metrics["attn/max_logit"]) == max(float(metrics[k]) for k in per_head)
    assert int(metrics["attn/qk_clipped_heads"]) == 0


def test_each_profile_defaults_to_the_winner_of_its_own_ab():
    """tiny: Muon (CPU A/B, 150 steps); small: AdamW (H100 A/B, 40 steps) — docs/log/pretrain.md."""
    from assets.pretrain import PretrainStageConfig
    from k3model.config import get_profile
    from k3model.train.pretrain import PretrainConfig
    assert (get_profile("tiny").optimizer, get_profile("small").optimizer) == ("muon", "adamw")
    assert PretrainStageConfig.profile_values("small", 1)["optimizer"] == "adamw"
    assert PretrainConfig(profile="tiny", stage=1).resolved().optimizer == "muon"
    assert PretrainConfig(profile="tiny", stage=1, optimizer="adamw").resolved().optimizer == "adamw"
