"""QAT's frozen expert weights (k3model.train.qat.frozen_expert_weights): inside the scope a forward
and its gradients equal the ones outside bit for bit, each expert stack is quantized once, a weight
changed inside the scope is quantized again, and the model's quantizer comes back afterwards."""

from __future__ import annotations

from dataclasses import replace

import torch

from k3model.config import get_profile
from k3model.model import K3Model
from k3model.moe import LatentMoE
from k3model.quantize import _qat_rounding
from k3model.train.qat import frozen_expert_weights, prepare_qat


def _qat_model(scale_rounding: str = "ceil") -> K3Model:
    cfg = replace(get_profile("smoke").model, vision=None, mtp_depth=0)
    torch.manual_seed(0)
    return prepare_qat(K3Model(cfg), scale_rounding)


def _counting(model: K3Model) -> list[int]:
    """Wraps each LatentMoE's quantizer to count its calls on expert weights (parameters)."""
    calls = [0]
    for moe in model.modules():
        if isinstance(moe, LatentMoE):
            inner = moe.fake_quant_mx

            def counted(t, fmt, inner=inner):
                calls[0] += isinstance(t, torch.nn.Parameter)
                return inner(t, fmt)
            moe.fake_quant_mx = counted
    return calls


def test_frozen_weights_give_the_same_bits_and_quantize_each_stack_once():
    model = _qat_model().eval()
    ids = torch.randint(0, model.cfg.vocab_size, (4, 37))
    with torch.no_grad():
        want = [model(ids[:, : t + 1]).logits_BTV for t in (5, 20, 36)]
    calls = _counting(model)
    originals = [m.fake_quant_mx for m in model.modules() if isinstance(m, LatentMoE)]
    with torch.no_grad(), frozen_expert_weights(model):
        got = [model(ids[:, : t + 1]).logits_BTV for t in (5, 20, 36)]
    for w, g in zip(want, got):
        assert torch.equal(w, g)
    n_moe = len(originals)
    assert n_moe >= 1 and calls[0] == 3 * n_moe  # three stacks per LatentMoE, once for three forwards
    assert [m.fake_quant_mx for m in model.modules() if isinstance(m, LatentMoE)] == originals


def test_a_weight_changed_inside_the_scope_is_quantized_again():
    model = _qat_model().eval()
    moe = next(m for m in model.modules() if isinstance(m, LatentMoE))
    ids = torch.randint(0, model.cfg.vocab_size, (4, 12))
    with torch.no_grad(), frozen_expert_weights(model):
        stale = model(ids).logits_BTV
        moe.w_up_EHL.mul_(1.5)  # in place, as an optimizer step or load_state_dict changes it
        inside = model(ids).logits_BTV
    with torch.no_grad():
        fresh = model(ids).logits_BTV
    assert not torch.equal(stale, fresh)
    assert torch.equal(inside, fresh)


def test_gradients_and_the_recorded_rounding_are_unchanged():
    model = _qat_model("floor")
    ids = torch.randint(0, model.cfg.vocab_size, (2, 16))
    moe = next(m for m in model.modules() if isinstance(m, LatentMoE))
    model(ids).logits_BTV.square().mean().backward()
    want = moe.w_gate_EHL.grad.clone()
    model.zero_grad()
    with frozen_expert_weights(model):
        assert _qat_rounding(moe) == "floor"  # k3model.quantize reads it from the quantizer
        model(ids).logits_BTV.square().mean().backward()
    assert torch.equal(moe.w_gate_EHL.grad, want)


def test_a_model_without_qat_passes_through():
    cfg = replace(get_profile("smoke").model, vision=None, mtp_depth=0)
    model = K3Model(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (4, 9))
    with torch.no_grad():
        want = model(ids).logits_BTV
        with frozen_expert_weights(model):
            assert torch.equal(model(ids).logits_BTV, want)


def test_nested_scopes_leave_the_model_as_it_was():
    model = _qat_model().eval()
    ids = torch.randint(0, model.cfg.vocab_size, (4, 9))
    with torch.no_grad():
        want = model(ids).logits_BTV
        with frozen_expert_weights(model):
            with frozen_expert_weights(model):
                inner = model(ids).logits_BTV
            outer = model(ids).logits_BTV
    assert torch.equal(inner, want) and torch.equal(outer, want)
    assert all("_expert_weights" not in vars(m) for m in model.modules() if isinstance(m, LatentMoE))


def test_a_captured_step_reused_by_a_later_rollout_reads_that_rollouts_stacks(monkeypatch, one_thread):
    # On CUDA the rollouts' decode step is a captured graph (engine.GraphStep) that reads the frozen
    # stacks by address, kept by engine.reused for later plays; the stacks are freed when a play's scope
    # ends, and the caching allocator hands their bytes to other tensors. A later play must capture anew
    # rather than replay reads of them (else NaN logits: docs/log/gpu.md). On the CPU: a step that runs
    # the forward with the stacks it saw when built, as the graph does, and freed stacks NaN-filled. The
    # second play reuses the first play's steps unless their stacks moved.
    import contextlib

    import envs
    from k3model import engine
    from k3model.engine import SamplingConfig
    from k3model.train import rollout
    from k3model.train.rollout import Job, TokenPolicy
    from tests.k3model.train.test_rollout import BYTES

    class ReplayedStep:
        def __init__(self, model, cache):
            self.model, self.cache = model, cache
            self.moes = [m for m in model.modules() if isinstance(m, LatentMoE) and "_expert_weights" in vars(m)]
            with torch.no_grad():
                self.stacks = [m._expert_weights() for m in self.moes]

        def __call__(self, tokens_B):
            scoped = [m._expert_weights for m in self.moes]
            for m, stacks in zip(self.moes, self.stacks):
                m._expert_weights = lambda stacks=stacks: stacks
            try:
                with torch.no_grad():
                    return self.model(tokens_B.view(-1, 1), cache=self.cache).logits_BTV[:, 0]
            finally:
                for m, own in zip(self.moes, scoped):
                    m._expert_weights = own

    @contextlib.contextmanager
    def freed_at_exit(model):
        with frozen_expert_weights(model):
            yield model
            with torch.no_grad():
                for m in model.modules():
                    if isinstance(m, LatentMoE):
                        for stack in m._expert_weights():
                            stack.fill_(float("nan"))

    monkeypatch.setattr(engine, "GraphStep", ReplayedStep)
    monkeypatch.setattr(rollout, "frozen_expert_weights", freed_at_exit)
    torch.manual_seed(0)
    model = prepare_qat(K3Model(replace(get_profile("smoke").model, name="smoke-unbounded", vision=None,
                                        mtp_depth=0))).eval()

    def play():
        jobs = [Job(lambda k=k: envs.make_env(("echo_word", "arith_word")[k % 2], seed=k, max_steps=2), seed=k,
                    close=True) for k in range(4)]
        policy = TokenPolicy(model, BYTES, SamplingConfig(max_new_tokens=4, temperature=1.0),
                             generator=torch.Generator().manual_seed(1), graphed=True)
        return [(ep.token_ids, ep.model_logprobs) for ep in policy.play(jobs)]

    first = play()
    steps = {key: hit[1] for key, hit in engine._CAPTURED[model].items()}
    second = play()
    assert second == first
    assert steps and all(engine._CAPTURED[model][key][1] is not step for key, step in steps.items())
