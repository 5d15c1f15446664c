"""The Triton KDA kernels on a CUDA GPU against the fp32 recurrent reference, at fla's tolerances.

Relative RMS error ‖fast − ref‖ / ‖ref‖ (fla's `assert_close`): o and final state 5e-3; dq, dk, dv,
dh0 8e-3; dg, dbeta 2e-2. Inputs as in fla's tests: bf16 q, k (L2-normalised), v, beta; fp32 g =
logsigmoid(N(0, 1)); fp32 initial state. Skipped without CUDA (CI has none); run on the H200 with
`pytest tests/kernels/kda/test_chunk_triton_gpu.py`.
"""

import pytest
import torch
import torch.nn.functional as F

from kernels.kda import chunk_kda, kda_decode_step, kda_decode_step_, naive_recurrent_kda

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

TOL = {"o": 5e-3, "ht": 5e-3, "dq": 8e-3, "dk": 8e-3, "dv": 8e-3, "dg": 2e-2, "dbeta": 2e-2, "dh0": 8e-3}


def make_inputs(B, T, H, D, seed, dtype=torch.bfloat16, decay_scale=1.0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = F.normalize(torch.rand(B, T, H, D, device="cuda", generator=gen), dim=-1).to(dtype)
    k = F.normalize(torch.rand(B, T, H, D, device="cuda", generator=gen), dim=-1).to(dtype)
    v = torch.randn(B, T, H, D, device="cuda", generator=gen).to(dtype)
    g = F.logsigmoid(torch.randn(B, T, H, D, device="cuda", generator=gen)) * decay_scale
    beta = torch.rand(B, T, H, device="cuda", generator=gen).sigmoid().to(dtype)
    h0 = torch.randn(B, H, D, D, device="cuda", generator=gen)
    return [q, k, v, g, beta, h0]


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def run(fn, inputs, with_h0, seed=1, poison=False):
    leaves = [x.clone().requires_grad_(True) for x in inputs]
    o, ht = fn(*leaves[:5], initial_state=leaves[5] if with_h0 else None, output_final_state=True)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    do = torch.randn(o.shape, device="cuda", generator=gen)
    dht = torch.randn(ht.shape, device="cuda", generator=gen)
    ((o.float() * do).sum() + (ht * dht).sum()).backward()
    names = ["dq", "dk", "dv", "dg", "dbeta"] + (["dh0"] if with_h0 else [])
    return {"o": o.detach(), "ht": ht.detach(), **{n: x.grad for n, x in zip(names, leaves)}}


@pytest.fixture
def nan_poisoned_allocations(monkeypatch):
    """Every buffer the kernels allocate starts as NaN, so an unwritten element cannot pass."""
    from kernels.kda.triton import bwd, prep, solve, state

    empty, empty_like = torch.empty, torch.empty_like

    class PoisonedTorch:
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def empty(*a, **kw):
            x = empty(*a, **kw)
            return x.fill_(float("nan")) if x.is_floating_point() else x

        @staticmethod
        def empty_like(*a, **kw):
            x = empty_like(*a, **kw)
            return x.fill_(float("nan")) if x.is_floating_point() else x

    for module in (prep, solve, state, bwd):
        monkeypatch.setattr(module, "torch", PoisonedTorch())


@pytest.mark.parametrize("T", [63, 1000, 4096])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("with_h0", [False, True])
def test_forward_and_every_gradient_match_fp32_reference(T, D, with_h0, nan_poisoned_allocations):
    inputs = make_inputs(2, T, 2, D, seed=T + D + with_h0)
    ref = run(naive_recurrent_kda, [x.float() for x in inputs], with_h0)
    out = run(chunk_kda, inputs, with_h0)
    errors = {n: rel(out[n], ref[n]) for n in ref}
    for n, x in out.items():
        assert torch.isfinite(x).all(), n
    bad = {n: e for n, e in errors.items() if e > TOL[n]}
    assert not bad, f"over tolerance: {bad}; all: {errors}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fp32_and_fp16_inputs_at_head_dim_128(dtype, nan_poisoned_allocations):
    """fp32 inputs double the state kernels' tiles (two pipeline stages overflowed shared memory
    on the H200 before `_state_stages`); fp16 takes the bf16 launch shapes."""
    inputs = make_inputs(2, 1000, 4, 128, seed=21, dtype=dtype)
    ref = run(naive_recurrent_kda, [x.float() for x in inputs], with_h0=True)
    out = run(chunk_kda, inputs, with_h0=True)
    errors = {n: rel(out[n], ref[n]) for n in ref}
    bad = {n: e for n, e in errors.items() if not e <= TOL[n]}
    assert not bad, f"over tolerance: {bad}; all: {errors}"


def test_causality_future_tokens_and_gates_do_not_reach_the_prefix():
    T, cut = 1000, 421
    q, k, v, g, beta, _ = make_inputs(1, T, 4, 128, seed=11)

    def prefix(q, k, v, g, beta):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v, g, beta)]
        o, _ = chunk_kda(*leaves)
        gen = torch.Generator(device="cuda").manual_seed(5)
        (o[:, :cut].float() * torch.randn(o[:, :cut].shape, device="cuda", generator=gen)).sum().backward()
        return [o[:, :cut].detach()] + [x.grad[:, :cut] for x in leaves]

    base = prefix(q, k, v, g, beta)
    q2, k2, v2, g2, beta2, _ = make_inputs(1, T, 4, 128, seed=12)
    g2 = g2 * 20  # strongly decaying future gates
    future = [torch.cat([a[:, :cut], b[:, cut:]], dim=1) for a, b in zip((q, k, v, g, beta), (q2, k2, v2, g2, beta2))]
    moved = prefix(*future)
    for name, a, b in zip(["o", "dq", "dk", "dv", "dg", "dbeta"], base, moved):
        assert torch.equal(a, b), (name, (a.float() - b.float()).abs().max().item())


def test_long_sequence_with_strongly_decaying_gates_has_no_nan():
    inputs = make_inputs(1, 16384, 2, 128, seed=13, decay_scale=8.0)
    out = run(chunk_kda, inputs, with_h0=True)
    for n, x in out.items():
        assert torch.isfinite(x).all(), n
    # within the anchored factorization's exact range (chunk_triton.py) it also matches the reference
    mild = make_inputs(1, 4096, 2, 128, seed=14, decay_scale=4.0)
    o, _ = chunk_kda(*mild[:5], initial_state=mild[5])
    o_ref, _ = naive_recurrent_kda(*[x.float() for x in mild[:5]], initial_state=mild[5])
    assert rel(o, o_ref) <= TOL["o"]


def test_gate_gradient_under_strong_decay_with_initial_state():
    """g = 2·logsigmoid(x − 2), about −4.3 per token: dg had 2.2e-2 relative error here (fla-core 0.6.0:
    2.6e-3) while the main diagonal of dA_qk went through the tf32 pair products; the bar is 2× fla."""
    inputs = make_inputs(1, 777, 2, 128, seed=17)
    gen = torch.Generator(device="cuda").manual_seed(18)
    inputs[3] = 2 * F.logsigmoid(torch.randn(inputs[3].shape, device="cuda", generator=gen) - 2)
    ref = run(naive_recurrent_kda, [x.double() for x in inputs], with_h0=True)
    out = run(chunk_kda, inputs, with_h0=True)
    errors = {n: rel(out[n], ref[n]) for n in ref}
    bad = {n: e for n, e in errors.items() if not e <= (5.2e-3 if n == "dg" else TOL[n])}
    assert not bad, f"over tolerance: {bad}; all: {errors}"


def test_decode_step_matches_reference_and_updates_in_place():
    B, H, D = 64, 16, 128
    q, k, v, g, beta, h0 = make_inputs(B, 1, H, D, seed=15)
    state = h0.clone()
    o = kda_decode_step_(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], state)
    o_ref, s_ref = kda_decode_step(*[x[:, 0].float() for x in (q, k, v, g, beta)], h0)
    assert rel(o, o_ref) <= 1e-2 and rel(state, s_ref) <= 1e-5


def test_default_inverse_is_exact_for_positive_keys_with_weak_decay():
    """Aligned positive keys (K = 32) with almost no decay make A_kk large and one-signed, where the
    doubling inverse the kernels once had cancelled (0.2–1.2 relative error in the interpreter, 3.9e9
    on the H200); the substitution inverse must stay within fla's tolerances on every output."""
    gen = torch.Generator(device="cuda").manual_seed(16)
    B, T, H, K = 1, 1000, 2, 32
    q = F.normalize(torch.rand(B, T, H, K, device="cuda", generator=gen), dim=-1)
    k = F.normalize(torch.rand(B, T, H, K, device="cuda", generator=gen), dim=-1)
    v = torch.randn(B, T, H, K, device="cuda", generator=gen)
    g = F.logsigmoid(torch.randn(B, T, H, K, device="cuda", generator=gen) + 5.0)
    beta = torch.rand(B, T, H, device="cuda", generator=gen)
    h0 = torch.randn(B, H, K, K, device="cuda", generator=gen)
    inputs = [q, k, v, g, beta, h0]
    ref = run(naive_recurrent_kda, [x.double() for x in inputs], with_h0=True)
    out = run(chunk_kda, inputs, with_h0=True)
    errors = {n: rel(out[n], ref[n]) for n in ref}
    bad = {n: e for n, e in errors.items() if not e <= TOL[n]}
    assert not bad, f"over tolerance: {bad}; all: {errors}"
