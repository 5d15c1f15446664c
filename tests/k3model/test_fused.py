"""k3model.fused: fused input projections give the unfused model's logits (prefill and decode steps
through the engine) and greedy tokens, one GEMM per fused module, an unchanged state_dict, refusals
for training, grad and stale copies, device and dtype moves, MXFP4 experts, batch invariance and
speculative decoding on top.

Tolerance: logits within assert_close(rtol=1e-5, atol=1e-5). The one GEMM rounds differently from
the n narrower ones in the last bits (MKL picks its kernel by width); on this machine the logits
(|logit| ≤ 1) part by ≤ 2e-6 (docs/log/serve.md, 2026-12-07), while a slice or bias misplaced by
one member gives differences of order 0.1.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from k3model.config import get_profile
from k3model.draft import draft_from_mtp
from k3model.engine import SamplingConfig, generate, prefill
from k3model.fused import BIAS, WEIGHT, fuse_projections, fused_modules, unfuse_projections
from k3model.kda_layer import KDALayer
from k3model.model import K3Model
from k3model.quantize import audit_quantized, convert_to_mx
from k3model.speculative import speculative_generate

from tests.k3model.test_model import smoke_model
from tests.k3model.test_speculative import aligned_draft, predictable_model

TOL = {"rtol": 1e-5, "atol": 1e-5}
# Leaf GEMM ops of a CPU step (aten::linear and aten::matmul dispatch to these).
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_grouped_mm")


def model_of(profile: str, q_rank: int | None = None, seed: int = 0) -> K3Model:
    cfg = get_profile(profile).model
    if q_rank is not None:
        cfg = replace(cfg, mla_q_rank=q_rank)
    torch.manual_seed(seed)
    return K3Model(cfg).eval()


def prompts_of(lengths, vocab, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def fused_copy(model):
    return fuse_projections(copy.deepcopy(model))



@pytest.mark.parametrize("profile, q_rank", [("smoke", None), ("tiny", None), ("tiny", 32)])
@torch.no_grad()
def test_fused_logits_and_greedy_tokens_equal_the_unfused_models(profile, q_rank):
    # tiny and smoke take queries straight from x (q_rank None); small has q_rank: tiny with 32 covers it.
    model = model_of(profile, q_rank)
    assert (model.cfg.mla_q_rank is None) == (q_rank is None)
    fused = fused_copy(model)
    cfg = model.cfg
    n_moe_with_shared = (cfg.n_layers - cfg.n_dense_layers) if cfg.n_shared else 0
    # Every KDA and MLA layer, the LatentMoEs and dense FFNs of the layers and the MTP block's.
    assert len(fused_modules(fused)) == cfg.n_layers + n_moe_with_shared + cfg.n_dense_layers + 2 * cfg.mtp_depth
    prompts = prompts_of([20, 20, 7, 33], cfg.vocab_size)
    cache, logits = prefill(model, prompts, 16)
    cache_f, logits_f = prefill(fused, prompts, 16)
    torch.testing.assert_close(logits_f, logits, **TOL)
    tokens = logits.argmax(-1)
    for _ in range(6):
        logits = model(tokens.unsqueeze(1), cache=cache).logits_BTV[:, 0]
        logits_f = fused(tokens.unsqueeze(1), cache=cache_f).logits_BTV[:, 0]
        torch.testing.assert_close(logits_f, logits, **TOL)
        tokens = logits.argmax(-1)
    sampling = SamplingConfig(max_new_tokens=12)
    assert [c.token_ids for c in generate(fused, prompts, sampling)] == \
        [c.token_ids for c in generate(model, prompts, sampling)]


def gemms_in_a_decode_step(model) -> int:
    with torch.no_grad():
        cache, logits = prefill(model, prompts_of([12], model.cfg.vocab_size), 4)
        tokens = logits.argmax(-1).unsqueeze(1)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model(tokens, cache=cache)
    return sum(e.name in GEMM_OPS for e in prof.events())


def test_a_decode_step_runs_one_gemm_per_fused_module():
    model = model_of("smoke")
    cfg = model.cfg
    before = gemms_in_a_decode_step(model)
    # Per layer: KDA 6 → 1, MLA 3 → 1, LatentMoE with shared experts 3 → 1, dense FFN 2 → 1.
    saved = 5 * cfg.n_kda_layers + 2 * cfg.n_mla_layers + 2 * (cfg.n_layers - cfg.n_dense_layers) * (cfg.n_shared > 0) \
        + cfg.n_dense_layers
    assert gemms_in_a_decode_step(fuse_projections(model)) == before - saved
    assert gemms_in_a_decode_step(unfuse_projections(model)) == before


def test_state_dict_is_unchanged_and_unfuse_restores_the_module():
    model = model_of("smoke")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    buffers = [name for name, _ in model.named_buffers()]
    fuse_projections(model)
    after = model.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(after[k], v) for k, v in before.items())
    kda = next(m for m in model.modules() if isinstance(m, KDALayer))
    assert getattr(kda, BIAS) is not None  # g_proj's bias, zeros beside it
    widths = [kda.q_proj.out_features] * 3 + [kda.f_down.out_features, kda.b_proj.out_features]
    assert torch.equal(getattr(kda, BIAS)[: sum(widths)], torch.zeros(sum(widths)))
    unfuse_projections(model)
    assert fused_modules(model) == [] and [name for name, _ in model.named_buffers()] == buffers
    assert "in_projections" not in vars(kda) and not hasattr(kda, WEIGHT)
    assert unfuse_projections(model) is model  # a no-op the second time


@torch.no_grad()
def test_fusing_twice_keeps_the_copies_and_changed_weights_are_refused_until_fused_again():
    model = fuse_projections(model_of("smoke"))
    kda = next(m for m in model.modules() if isinstance(m, KDALayer))
    first = getattr(kda, WEIGHT)
    fuse_projections(model)
    assert getattr(kda, WEIGHT) is first  # idempotent: nothing rebuilt
    ids = torch.tensor(prompts_of([9], model.cfg.vocab_size))
    other = model_of("smoke", seed=5)
    model.load_state_dict(other.state_dict())
    with pytest.raises(ValueError, match="changed in place since fuse_projections"):
        model(ids)
    fuse_projections(model)  # refreshed from the loaded weights
    assert getattr(kda, WEIGHT) is not first
    torch.testing.assert_close(model(ids).logits_BTV, other(ids).logits_BTV, **TOL)


def test_training_mode_and_grad_are_refused():
    model = model_of("smoke")
    ids = torch.tensor(prompts_of([9], model.cfg.vocab_size))
    with pytest.raises(ValueError, match="model.eval"):
        fuse_projections(model.train())
    fuse_projections(model.eval())
    model.train()
    with torch.no_grad(), pytest.raises(ValueError, match="inference-only"):
        model(ids)
    model.eval()
    with pytest.raises(ValueError, match="grad enabled"):
        model.compute_loss(ids)
    with torch.no_grad():
        model(ids)  # eval mode without grad: serves
    # Frozen Parameters may run with grad enabled: nothing would train them.
    model.requires_grad_(False)
    model(ids)
    unfuse_projections(model.requires_grad_(True).train())
    model.compute_loss(ids)["loss/total"].backward()  # the unfused model trains again


@torch.no_grad()
def test_a_dtype_move_casts_the_fused_copies_with_the_parameters():
    model = model_of("smoke")
    fused = fused_copy(model).to(torch.float64)
    kda = next(m for m in fused.modules() if isinstance(m, KDALayer))
    assert getattr(kda, WEIGHT).dtype == torch.float64 == kda.q_proj.weight.dtype
    ids = torch.tensor(prompts_of([9], model.cfg.vocab_size))
    torch.testing.assert_close(fused(ids).logits_BTV, model.to(torch.float64)(ids).logits_BTV, rtol=1e-10, atol=1e-10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@torch.no_grad()
def test_a_device_move_carries_the_fused_copies():
    model = model_of("smoke")
    fused = fused_copy(model).cuda()
    kda = next(m for m in fused.modules() if isinstance(m, KDALayer))
    assert getattr(kda, WEIGHT).is_cuda
    ids = torch.tensor(prompts_of([9], model.cfg.vocab_size), device="cuda")
    # Looser than TOL: the chunked KDA kernels' tf32 dots can round a last-bit GEMM difference up to
    # ~1e-4 (k3model/engine.py); a misplaced member still differs by ~0.1.
    torch.testing.assert_close(fused(ids).logits_BTV, model.cuda()(ids).logits_BTV, rtol=2e-3, atol=2e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@torch.no_grad()
def test_the_captured_step_of_a_fused_model_equals_its_eager_step_and_unfusing_recaptures():
    from k3model import engine

    model = fuse_projections(model_of("smoke").cuda().to(torch.bfloat16))
    prompts = prompts_of([5, 5, 5], model.cfg.vocab_size)
    cache, logits_BV = prefill(model, prompts, capacity=16)
    eager_cache, graph = cache.to_static(16), engine.GraphStep(model, cache.to_static(16))
    tokens_B = logits_BV.argmax(-1)
    for _ in range(8):
        eager_BV = model(tokens_B.unsqueeze(1), cache=eager_cache).logits_BTV[:, 0]
        assert torch.equal(eager_BV, graph(tokens_B))
        tokens_B = eager_BV.argmax(-1)
    # generate keeps its captured step per model; the fused copies' addresses are part of its key, so
    # a step captured over them is not replayed once they are freed.
    sampling = SamplingConfig(max_new_tokens=6)
    generate(model, prompts, sampling)
    captured = {key: step for key, (_, step) in engine._CAPTURED[model].items()}
    unfuse_projections(model)
    generate(model, prompts, sampling)
    assert all(engine._CAPTURED[model][key][1] is not step for key, step in captured.items())


@torch.no_grad()
def test_fusing_a_quantized_model_keeps_its_experts_mxfp4():
    # convert_to_mx swaps each LatentMoE for an MXLatentMoE (routed experts packed); fusing covers its
    # latent and shared projections and leaves the routed experts on the MX path.
    quantized = convert_to_mx(smoke_model())
    fused = fused_copy(quantized)
    moes = [name for name in fused_modules(fused) if name.endswith(".ffn") and name.startswith("layers.")]
    assert len(moes) == quantized.cfg.n_layers  # the MoEs and the dense first layer's FFN
    ids = torch.tensor(prompts_of([10], quantized.cfg.vocab_size))
    assert audit_quantized(fused, ids).ok  # every expert weight went through the MXFP4 op, prefill and step
    prompts = prompts_of([10, 6], quantized.cfg.vocab_size)
    cache, logits = prefill(quantized, prompts, 4)
    cache_f, logits_f = prefill(fused, prompts, 4)
    torch.testing.assert_close(logits_f, logits, **TOL)
    sampling = SamplingConfig(max_new_tokens=8)
    assert [c.token_ids for c in generate(fused, prompts, sampling)] == \
        [c.token_ids for c in generate(quantized, prompts, sampling)]


def test_a_fused_batch_gives_every_row_what_it_gets_alone_bitwise(one_thread):
    # What the server's continuous batching stands on (k3model/engine.py), with the fused GEMMs.
    model = fuse_projections(smoke_model())
    prompts = prompts_of([5, 17, 1, 9, 17, 30], 512)
    cfgs = [SamplingConfig(max_new_tokens=n) for n in (8, 6, 8, 3, 6, 7)]
    batch = generate(model, prompts, cfgs)
    for prompt, cfg, got in zip(prompts, cfgs, batch):
        alone = generate(model, [prompt], cfg)[0]
        assert got.token_ids == alone.token_ids and got.model_logprobs == alone.model_logprobs


@torch.no_grad()
def test_greedy_speculative_decoding_on_a_fused_target_and_draft_is_their_greedy_output():
    # A verify keeps its KDA conv inputs for rollbacks (kda_layer.VerifyPositions): with fused
    # projections they are views of the one GEMM's output.
    target = predictable_model(1)
    draft = aligned_draft(target).eval()
    fuse_projections(target)
    fuse_projections(draft)
    assert fused_modules(draft)  # the draft's MLA block and dense FFN
    cfg = SamplingConfig(max_new_tokens=12)
    prompts = prompts_of([5, 11], 512, seed=3)
    plain = [c.token_ids for c in generate(target, prompts, cfg)]
    rolled_back = 0
    for draft_len in (2, 4):
        for prompt, expected in zip(prompts, plain):
            out, stats = speculative_generate(target, draft, prompt, cfg, draft_len)
            assert out == expected
            rolled_back += stats.drafted - stats.accepted
    assert rolled_back > 0  # rejections rolled the caches back


@torch.no_grad()
def test_a_deep_copy_of_a_fused_model_serves_from_its_own_copies():
    # draft_from_mtp deep-copies the target's MTP block; load_draft then loads the draft's weights.
    model = fuse_projections(model_of("smoke"))
    twin = copy.deepcopy(model)
    assert fused_modules(twin) == fused_modules(model)
    kda, kda_twin = (next(m for m in x.modules() if isinstance(m, KDALayer)) for x in (model, twin))
    assert getattr(kda_twin, WEIGHT).data_ptr() != getattr(kda, WEIGHT).data_ptr()
    ids = torch.tensor(prompts_of([9], model.cfg.vocab_size))
    assert torch.equal(twin(ids).logits_BTV, model(ids).logits_BTV)
    kda_twin.g_proj.bias.add_(1.0)
    with pytest.raises(ValueError, match="changed in place"):
        twin(ids)
    model(ids)  # the original's copies are its own
    draft = draft_from_mtp(model).eval()
    mla = draft.layers[0].mixer
    x = torch.randn(2, 3, model.cfg.d_model)
    draft.load_state_dict(draft_from_mtp(model_of("smoke", seed=3)).state_dict())
    with pytest.raises(ValueError, match="changed in place"):
        mla.in_projections(x)
    fuse_projections(draft)
    for got, want in zip(mla.in_projections(x), (mla.q_proj(x), mla.kv_down(x), mla.g_proj(x))):
        torch.testing.assert_close(got, want, **TOL)


@pytest.mark.slow  # ~30 s on the 2-core CPU: Dynamo traces every module kind
@torch.no_grad()
def test_compiled_regions_trace_the_fused_projections():
    # As benchmarks/decode/decode.py --fuse-projections --compile-regions runs it on CUDA; here
    # Dynamo's tracing with the aot_eager backend (tests/k3model/test_compiled.py), prefill and steps.
    from k3model.compiled import compile_regions

    torch._dynamo.reset()
    fused = fuse_projections(model_of("smoke"))
    compiled = compile_regions(copy.deepcopy(fused), backend="aot_eager")
    prompts = prompts_of([12, 12], fused.cfg.vocab_size)
    cache, logits = prefill(fused, prompts, 4)
    cache_c, logits_c = prefill(compiled, prompts, 4)
    torch.testing.assert_close(logits_c, logits, **TOL)
    tokens = logits.argmax(-1).unsqueeze(1)
    torch.testing.assert_close(compiled(tokens, cache=cache_c).logits_BTV, fused(tokens, cache=cache).logits_BTV, **TOL)
    compiled.train()
    with pytest.raises(ValueError, match="inference-only"):
        compiled(tokens)
