"""k3model.compiled: the regionally compiled model computes what the eager one does.

Dynamo's tracing and AOT autograd are checked on the CPU with the `aot_eager` backend (no code
generation); Inductor's kernels run on the H200 (benchmarks/train_step.py --compile-regions).
"""

import copy
from dataclasses import replace

import pytest
import torch

from k3model.config import get_profile
from k3model.model import K3Model


def test_compiled_regions_give_the_eager_loss_and_gradients_with_one_graph_per_kind():
    from torch._dynamo.utils import counters

    from k3model.compiled import compile_regions

    torch._dynamo.reset()
    counters.clear()
    cfg = replace(get_profile("smoke").model, vision=None, mtp_depth=0, n_layers=6, attn_res_block=3,
                  activation_checkpointing=True)
    torch.manual_seed(0)
    eager = K3Model(cfg).train()
    compiled = compile_regions(copy.deepcopy(eager), backend="aot_eager")
    ids = torch.randint(0, cfg.vocab_size, (2, 24))
    losses = []
    for model in (eager, compiled):
        loss = model.compute_loss(ids)["loss/total"]
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=1e-6)
    for (name, p0), p1 in zip(eager.named_parameters(), compiled.parameters()):
        assert (p1.grad is None) == (p0.grad is None), name  # layer 0's AttnRes has one source: unused
        if p0.grad is not None:
            # fp32 reordering noise scales with the tensor (embedding rows sum over every position).
            scale = float(p0.grad.abs().max())
            torch.testing.assert_close(p1.grad, p0.grad, rtol=1e-4, atol=1e-5 * scale, msg=name)
    # The balancing statistics were gathered once per MoE layer (not again in the recomputation).
    for m0, m1 in zip(eager.moe_layers(), compiled.moe_layers()):
        torch.testing.assert_close(m1._margin_hist_EX, m0._margin_hist_EX)
    # Six layers, a handful of graphs: the layers of one kind share their compiled code.
    assert counters["stats"]["unique_graphs"] < 6 * 4
    # The eager model was not touched: no MLA layer of it carries a compiled attention.
    assert all("_attend_expanded" not in vars(m) for m in eager.modules())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Inductor's Triton kernels need CUDA")
def test_compiled_regions_on_cuda_give_the_eager_step_under_bf16_autocast():
    """The same check with Inductor on the GPU, bf16 autocast as in training: fused elementwise chains
    round differently, so the bar is bf16's, and routing is fixed by fp32 router scores."""
    from k3model.compiled import compile_regions

    cfg = replace(get_profile("smoke").model, vision=None, mtp_depth=0, activation_checkpointing=True)
    torch.manual_seed(0)
    eager = K3Model(cfg).cuda().train()
    compiled = compile_regions(copy.deepcopy(eager), dynamic=True)
    ids = torch.randint(0, cfg.vocab_size, (2, 128), device="cuda")
    losses = []
    for model in (eager, compiled):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model.compute_loss(ids)["loss/total"]
        loss.backward()
        losses.append(loss.detach().float())
    torch.testing.assert_close(losses[1], losses[0], rtol=2e-3, atol=2e-3)
    g0 = torch.cat([p.grad.flatten() for p in eager.parameters() if p.grad is not None])
    g1 = torch.cat([p.grad.flatten() for p in compiled.parameters() if p.grad is not None])
    assert ((g1 - g0).norm() / g0.norm()).item() < 2e-2
