"""Context-parallel KDA and the conv halo on the CPU: 2 and 4 gloo processes vs one process.

Each rank holds a contiguous segment of the same sequence (lengths not multiples of the chunk);
outputs and every gradient, gathered across ranks, must equal the single-process torch result
(fp32, relative error ≤ 1e-5). The bytes each rank hands to the collectives are counted at two
sequence lengths and must not change.
"""

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from kernels.kda import chunk_kda
from kernels.kda.cp import bytes_sent, causal_conv1d, causal_conv1d_cp, chunk_kda_cp, reset_bytes_sent

B, H, K, V, C, W = 2, 2, 16, 8, 12, 4


def make_inputs(T, seed):
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, H, K, generator=gen) + 2.0)
    beta = torch.rand(B, T, H, generator=gen)
    do = torch.randn(B, T, H, V, generator=gen)
    x = torch.randn(B, T, C, generator=gen)
    w = torch.randn(C, 1, W, generator=gen)
    dy = torch.randn(B, T, C, generator=gen)
    return [q, k, v, g, beta], do, (x, w, dy)


def run_rank(rank, world, init_file, out_dir, lengths):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    results = {}
    for T in lengths:
        kda_in, do, (x, w, dy) = make_inputs(T, seed=T)
        bounds = [T * r // world for r in range(world + 1)]
        seg = slice(bounds[rank], bounds[rank + 1])
        reset_bytes_sent()
        leaves = [t[:, seg].clone().requires_grad_(True) for t in kda_in]
        o = chunk_kda_cp(*leaves)
        o.backward(do[:, seg])
        xl = x[:, seg].clone().requires_grad_(True)
        wl = w.clone().requires_grad_(True)
        y = causal_conv1d_cp(xl, wl)
        y.backward(dy[:, seg])
        results[T] = {"o": o.detach(), "grads": [t.grad for t in leaves], "y": y.detach(),
                      "dx": xl.grad, "dw": wl.grad, "bytes": bytes_sent()}
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def run_world(world, lengths):
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(run_rank, args=(world, os.path.join(tmp, "init"), tmp, lengths), nprocs=world, join=True)
        return [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(world)]


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def reference(T):
    kda_in, do, (x, w, dy) = make_inputs(T, seed=T)
    leaves = [t.clone().requires_grad_(True) for t in kda_in]
    o, _ = chunk_kda(*leaves)
    o.backward(do)
    xl, wl = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    y = causal_conv1d(xl, wl)
    y.backward(dy)
    return o.detach(), [t.grad for t in leaves], y.detach(), xl.grad, wl.grad


@pytest.mark.parametrize("world, lengths", [(2, [130, 262]), (4, [200])])
def test_context_parallel_equals_single_process(world, lengths):
    per_rank = run_world(world, lengths)
    for T in lengths:
        o_ref, g_ref, y_ref, dx_ref, dw_ref = reference(T)
        o = torch.cat([r[T]["o"] for r in per_rank], dim=1)
        assert rel(o, o_ref) <= 1e-5
        for i, name in enumerate(["dq", "dk", "dv", "dg", "dbeta"]):
            got = torch.cat([r[T]["grads"][i] for r in per_rank], dim=1)
            assert rel(got, g_ref[i]) <= 1e-5, name
        assert rel(torch.cat([r[T]["y"] for r in per_rank], dim=1), y_ref) <= 1e-6
        assert rel(torch.cat([r[T]["dx"] for r in per_rank], dim=1), dx_ref) <= 1e-6
        assert rel(sum(r[T]["dw"] for r in per_rank), dw_ref) <= 1e-6
    if len(lengths) == 2:
        # fixed-size exchanges: the same bytes at both lengths, on every rank
        for r in per_rank:
            assert r[lengths[0]]["bytes"] == r[lengths[1]]["bytes"]
            assert r[lengths[0]]["bytes"]["kda_forward"] == B * H * K * (K + V) * 4
            assert r[lengths[0]]["bytes"]["kda_backward"] == B * H * K * V * 4
            assert r[lengths[0]]["bytes"]["conv_forward"] == B * (W - 1) * C * 4


def test_cp_without_a_process_group_says_what_to_do():
    (q, k, v, g, beta), _, _ = make_inputs(70, seed=0)
    with pytest.raises(ValueError, match="init_process_group"):
        chunk_kda_cp(q, k, v, g, beta)
