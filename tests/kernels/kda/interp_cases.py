"""The Triton KDA kernels on the CPU under TRITON_INTERPRET=1: each case prints one JSON line of metrics.

Run as a script in a fresh process (`triton.jit` picks interpreter or compiler when the kernels are
imported, so the rest of a test session cannot have imported them first):
    TRITON_INTERPRET=1 python tests/kernels/kda/interp_cases.py [case ...]
Every buffer the kernels allocate starts NaN-poisoned, so an element a kernel forgets to write shows up.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import conftest  # noqa: E402  (the NumPy ≥ 2.4 shim for the interpreter; poisoned allocations)

from kernels.kda import chunk_kda, kda_decode_step, kda_decode_step_, naive_recurrent_kda  # noqa: E402

conftest.poison_allocations()


def make_inputs(B, T, H, K, V, seed, decay_scale=1.0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, H, K, generator=gen)) * decay_scale
    beta = torch.rand(B, T, H, generator=gen)
    h0 = torch.randn(B, H, K, V, generator=gen)
    return q.to(dtype), k.to(dtype), v.to(dtype), g, beta.to(dtype), h0


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def grads(fn, inputs, with_h0, seed=1):
    leaves = [x.clone().requires_grad_(True) for x in inputs]
    o, s = fn(*leaves[:5], initial_state=leaves[5] if with_h0 else None, output_final_state=True)
    gen = torch.Generator().manual_seed(seed)
    wo = torch.randn(o.shape, generator=gen)
    ws = torch.randn(s.shape, generator=gen)
    ((o.float() * wo).sum() + (s * ws).sum()).backward()
    names = ["dq", "dk", "dv", "dg", "dbeta"] + (["dh0"] if with_h0 else [])
    return o.detach(), s.detach(), dict(zip(names, [x.grad for x in leaves[: len(names)]]))


def triton_kda(*args, **kwargs):
    return chunk_kda(*args, backend="triton", **kwargs)


def compare(B, T, H, K, V, seed, with_h0, decay_scale=1.0, dtype=torch.float32):
    inputs = make_inputs(B, T, H, K, V, seed, decay_scale, dtype)
    ref_inputs = [x.float() for x in inputs]
    o_r, s_r, g_r = grads(naive_recurrent_kda, ref_inputs, with_h0)
    o, s, g = grads(triton_kda, list(inputs), with_h0)
    out = {"o": rel(o, o_r), "ht": rel(s, s_r)}
    out.update({n: rel(g[n], g_r[n]) for n in g})
    out["finite"] = bool(torch.isfinite(o).all() and torch.isfinite(s).all()
                         and all(torch.isfinite(x).all() for x in g.values()))
    return out


def case_odd_len_h0():
    return compare(1, 63, 2, 16, 16, seed=0, with_h0=True)


def case_two_chunks_wide():
    # T = 100 spans a full and a partial chunk; K = 32 > V = 24 (not a power of two), batch 2.
    return compare(2, 100, 1, 32, 24, seed=1, with_h0=False)


def case_bf16():
    return compare(1, 64, 1, 16, 16, seed=2, with_h0=True, dtype=torch.bfloat16)


def case_strong_decay():
    # Log decays of 4·logsigmoid(N(0, 1)): about −3.2 per token on average, below −10 at times.
    return compare(1, 128, 1, 16, 16, seed=3, with_h0=True, decay_scale=4.0)


def case_strong_decay_tf32():
    """The gate gradient under strong decay, g = 2·logsigmoid(x − 2) (about −4.3 per token), with
    tf32 products truncated as on sm_90 (conftest shim 4), against the float64 recurrence."""
    q, k, v, _, beta, h0 = make_inputs(1, 64, 2, 32, 32, seed=10)
    g = 2 * F.logsigmoid(torch.randn(q.shape, generator=torch.Generator().manual_seed(11)) - 2)
    inputs = [q, k, v, g, beta, h0]
    o_r, s_r, g_r = grads(naive_recurrent_kda, [x.double() for x in inputs], with_h0=True)
    conftest.TF32[0] = True
    try:
        o, s, g_t = grads(triton_kda, inputs, with_h0=True)
    finally:
        conftest.TF32[0] = False
    return {"o": rel(o, o_r), "ht": rel(s, s_r), **{n: rel(g_t[n], g_r[n]) for n in g_t}}


def case_positive_keys_weak_decay():
    """Positive keys with weak gates make A_kk large and one-signed: the regime where the doubling
    inverse the kernels once had cancelled (docs/log/kda.md); against the float64 recurrence."""
    gen = torch.Generator().manual_seed(22)
    B, T, H, K, V = 1, 100, 2, 32, 24
    q = F.normalize(torch.rand(B, T, H, K, generator=gen), dim=-1)
    k = F.normalize(torch.rand(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, H, K, generator=gen) + 5.0)
    beta = torch.rand(B, T, H, generator=gen)
    h0 = torch.randn(B, H, K, V, generator=gen)
    inputs = [q, k, v, g, beta, h0]
    o_r, s_r, g_r = grads(naive_recurrent_kda, [x.double() for x in inputs], with_h0=True)
    o, s, g_t = grads(triton_kda, inputs, with_h0=True)
    return {"o": rel(o, o_r), "ht": rel(s, s_r), **{n: rel(g_t[n], g_r[n]) for n in g_t}}


def case_explicit_tiles():
    """A TileConfig passed to chunk_kda_triton reaches the kernels: 16-wide key slices (the key-slice
    loops run twice at K = 32) give the default's results to rounding; the kernels' BKS constexprs
    are recorded to show which slices ran."""
    from kernels.kda.chunk_triton import chunk_kda_triton
    from kernels.kda.triton import bwd, prep
    from kernels.kda.triton.common import TileConfig

    seen: list[int] = []
    for kernel in (prep._prep_pairs_kernel, bwd._bwd_pairs_kernel):
        kernel.add_pre_run_hook(lambda *a, **kw: seen.append(int(kw["BKS"])))
    inputs = make_inputs(1, 100, 2, 32, 24, seed=23)
    base = grads(chunk_kda_triton, inputs, with_h0=True)
    sliced = grads(lambda *a, **kw: chunk_kda_triton(*a, tiles=TileConfig(prep_key_slice=16, bwd_key_slice=16), **kw),
                   inputs, with_h0=True)
    out = {"o": rel(sliced[0], base[0]), "ht": rel(sliced[1], base[1])}
    out.update({n: rel(sliced[2][n], base[2][n]) for n in base[2]})
    out["bks"] = seen
    return out


def case_extreme_decay():
    # Log decays uniform in (−60, 0): past the anchored factorization's exact range (chunk_triton.py),
    # where the kernels must still return finite numbers.
    q, k, v, g, beta, h0 = make_inputs(1, 128, 1, 16, 16, seed=8)
    g = -60 * torch.rand(g.shape, generator=torch.Generator().manual_seed(9))
    _, _, grads_ = grads(triton_kda, [q, k, v, g, beta, h0], with_h0=True)
    o, s = triton_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o_r, s_r = naive_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    return {"finite": bool(torch.isfinite(o).all() and torch.isfinite(s).all()
                           and all(torch.isfinite(x).all() for x in grads_.values())),
            "o": rel(o, o_r), "ht": rel(s, s_r)}


def case_causality():
    """Prefix outputs and prefix gradients of a prefix-only loss must not move when the future does."""
    T, cut = 96, 40  # the cut falls inside the first chunk, inside its third sub-chunk
    q, k, v, g, beta, _ = make_inputs(1, T, 2, 16, 16, seed=4)

    def prefix(q, k, v, g, beta):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v, g, beta)]
        o, _ = triton_kda(*leaves)
        gen = torch.Generator().manual_seed(5)
        (o[:, :cut] * torch.randn(o[:, :cut].shape, generator=gen)).sum().backward()
        return [o[:, :cut].detach()] + [x.grad[:, :cut] for x in leaves]

    base = prefix(q, k, v, g, beta)
    gen = torch.Generator().manual_seed(6)
    q2, k2, v2, g2, beta2 = (x.clone() for x in (q, k, v, g, beta))
    q2[:, cut:] = torch.randn(q2[:, cut:].shape, generator=gen)
    k2[:, cut:] = F.normalize(torch.randn(k2[:, cut:].shape, generator=gen), dim=-1)
    v2[:, cut:] = 10 * torch.randn(v2[:, cut:].shape, generator=gen)
    g2[:, cut:] = -30 * torch.rand(g2[:, cut:].shape, generator=gen)  # strongly decaying future gates
    beta2[:, cut:] = torch.rand(beta2[:, cut:].shape, generator=gen)
    moved = prefix(q2, k2, v2, g2, beta2)
    names = ["o", "dq", "dk", "dv", "dg", "dbeta"]
    return {n: (a - b).abs().max().item() for n, a, b in zip(names, base, moved)}


def case_decode():
    B, H, K, V = 3, 2, 16, 24
    q, k, v, g, beta, h0 = make_inputs(B, 1, H, K, V, seed=7)
    state = h0.clone()
    o = kda_decode_step_(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], state, backend="triton")
    o_r, s_r = kda_decode_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], h0)
    return {"o": rel(o, o_r), "state": rel(state, s_r)}


def case_recurrent():
    # T tokens in one call against the reference, and against T one-token calls (bitwise: the
    # speculative verify relies on it), the state after each token kept.
    from kernels.kda.decode import kda_recurrent_triton

    B, T, H, K, V = 2, 4, 2, 16, 24
    q, k, v, g, beta, h0 = make_inputs(B, T, H, K, V, seed=9)
    o, final, states = kda_recurrent_triton(q, k, v, g, beta, h0, keep_states=True)
    o_r, s_r = naive_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    state, steps_o, gap = h0, [], 0.0
    for t in range(T):
        o_t, state, _ = kda_recurrent_triton(*(x[:, t: t + 1] for x in (q, k, v, g, beta)), state)
        steps_o.append(o_t)
        gap = max(gap, (state - states[t]).abs().max().item())
    gap = max(gap, (torch.cat(steps_o, 1) - o).abs().max().item(), (final - states[-1]).abs().max().item())
    return {"o": rel(o, o_r), "state": rel(final, s_r), "steps_gap": gap, "h0_kept": (h0 == make_inputs(B, T, H, K, V, seed=9)[5]).all().item()}


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}

if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("run with TRITON_INTERPRET=1")
    for name in sys.argv[1:] or list(CASES):
        print(json.dumps({"case": name, **CASES[name]()}), flush=True)
