"""k3model.compiled: the regionally compiled model computes what the eager one does.

Dynamo's tracing and AOT autograd are checked on the CPU with the `aot_eager` backend (no code
generation); Inductor's kernels run on the H200 (benchmarks/model/train_step.py --compile-regions).
"""

import copy
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from k3model.config import get_profile
from k3model.model import K3Model


def test_a_process_that_never_compiles_does_not_import_dynamo():
    """The eager islands are marked by compile_regions, not at import: Dynamo costs ~2.5 s of every
    process that imports the model without compiling or stepping a torch optimizer (whose first step
    imports it): the `k3` and Dagster commands, data, evaluation and decoding tasks."""
    code = ("import sys, k3model.model, k3model.engine, k3model.train.grpo; "
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


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
    """The same check with Inductor on the GPU, bf16 autocast as in training. bf16 alone moves this
    random model's gradients by ~24 % (eager bf16 against eager fp32: the fp32 router scores see
    bf16-rounded inputs and top-k ties flip), so the compiled step is held to the eager bf16 step's
    distance from the fp32 reference, not to the eager bf16 step (probes-archive:benchmarks/probes/compiled_grads.py;
    a missing or wrong gradient is ~100 % off)."""
    from k3model.compiled import compile_regions

    cfg = replace(get_profile("smoke").model, vision=None, mtp_depth=0, activation_checkpointing=True)
    torch.manual_seed(0)
    eager = K3Model(cfg).cuda().train()
    compiled = compile_regions(copy.deepcopy(eager), dynamic=True)
    ids = torch.randint(0, cfg.vocab_size, (2, 128), device="cuda")

    def step(model, bf16):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = model.compute_loss(ids)["loss/total"]
        loss.backward()
        names = [n for n, p in model.named_parameters() if p.grad is not None]
        return loss.detach().float(), names, torch.cat([p.grad.flatten().float() for p in model.parameters()
                                                        if p.grad is not None])

    loss_ref, names_ref, g_ref = step(eager, bf16=False)
    loss_eager, _, g_eager = step(eager, bf16=True)
    loss_compiled, names_compiled, g_compiled = step(compiled, bf16=True)
    torch.testing.assert_close(loss_compiled, loss_eager, rtol=2e-3, atol=2e-3)
    assert names_compiled == names_ref
    eager_off = ((g_eager - g_ref).norm() / g_ref.norm()).item()
    compiled_off = ((g_compiled - g_ref).norm() / g_ref.norm()).item()
    assert compiled_off < max(1.5 * eager_off, 2e-2), (compiled_off, eager_off)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Inductor's Triton kernels need CUDA")
@pytest.mark.parametrize("n_sources", [2, 3, 4, 5])
def test_a_compiled_attn_res_gives_the_eager_gradients_at_every_source_count(n_sources):
    """AttnRes alone, compiled with Inductor on the GPU, in fp32: the output and every gradient
    (sources, query, key norm) within fp32 rounding of the eager module. The compiled source-by-source
    sum got the sources' gradients 190–420 % wrong at three sources (torch 2.11)."""
    from k3model.attn_res import AttnRes

    torch._dynamo.reset()
    torch.manual_seed(n_sources)
    eager = AttnRes(64).cuda()
    with torch.no_grad():  # a nonzero query, so α is not uniform
        eager.query.normal_(0, 0.5)
        eager.key_norm.weight.uniform_(0.5, 1.5)
    compiled = copy.deepcopy(eager)
    compiled.compile(dynamic=True)
    sources = [torch.randn(2, 96, 64, device="cuda") * (1 + i) for i in range(n_sources)]
    g_out = torch.randn(2, 96, 64, device="cuda")
    results = []
    for module in (eager, compiled):
        xs = [s.clone().requires_grad_(True) for s in sources]
        y = module(xs)
        (y * g_out).sum().backward()
        results.append([y.detach()] + [x.grad for x in xs] + [module.query.grad, module.key_norm.weight.grad])
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))
