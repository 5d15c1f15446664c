"""train.common.CapturedStep: a K3 training step captured in one CUDA graph and replayed takes the
steps the eager loop takes — the same losses, parameters, optimizer state and MoE routing biases."""

import copy
from dataclasses import replace

import pytest
import torch

from k3model.config import get_profile
from k3model.model import K3Model
from k3model.train.common import CapturedStep

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need CUDA")


def test_captured_step_needs_a_cuda_batch():
    with pytest.raises(ValueError, match="CUDA batch"):
        CapturedStep(lambda b: None, torch.zeros(2, 3, dtype=torch.long))


def _step(model, opt):
    def step(ids):
        opt.zero_grad(set_to_none=True)
        total = None
        for part in ids.chunk(2):  # two micro-batches: the gradient accumulates in the graph
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model.compute_loss(part)["loss/total"]
            (loss / 2).backward()
            total = loss.detach() if total is None else total + loss.detach()
        opt.step()
        for layer in model.moe_layers():
            layer.update_bias()
        return total / 2
    return step


@cuda
@pytest.mark.parametrize("compiled", [False, True], ids=["eager-modules", "compiled-regions"])
def test_captured_steps_equal_eager_steps(compiled):
    cfg = replace(get_profile("smoke").model, vision=None, mtp_depth=0, activation_checkpointing=False)
    torch.manual_seed(0)
    eager = K3Model(cfg).cuda().train()
    graphed = copy.deepcopy(eager)
    if compiled:
        from k3model.compiled import compile_regions

        compile_regions(eager, dynamic=True)
        compile_regions(graphed, dynamic=True)
    batches = [torch.randint(0, cfg.vocab_size, (4, 64), device="cuda") for _ in range(4)]
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3, fused=True, capturable=True) for m in (eager, graphed)]
    with pytest.raises(ValueError, match="capturable"):
        CapturedStep(_step(graphed, opts[1]), batches[0],
                     optimizer=torch.optim.AdamW(graphed.parameters(), lr=1e-3, fused=True))

    eager_step = _step(eager, opts[0])
    eager_losses = [eager_step(b).clone() for b in [batches[0], batches[0], *batches[1:]]][2:]
    captured = CapturedStep(_step(graphed, opts[1]), batches[0], warmup=2, optimizer=opts[1])
    graphed_losses = [captured(b).clone() for b in batches[1:]]
    torch.cuda.synchronize()

    # Five steps each: two warm-up steps, then three replays that ran the optimizer.
    assert all(int(s["step"]) == 5 for s in opts[1].state.values())
    torch.testing.assert_close(torch.stack(graphed_losses), torch.stack(eager_losses), rtol=1e-4, atol=1e-4)
    assert len(set(float(x) for x in graphed_losses)) == 3  # three batches, three losses: not one replayed value
    for (name, p0), p1 in zip(eager.named_parameters(), graphed.parameters()):
        torch.testing.assert_close(p1, p0, rtol=1e-3, atol=1e-4, msg=name)
    # The routing biases moved and moved alike: LatentMoE's statistics were cleared in place, so the
    # replays did not accumulate them across steps.
    for m0, m1 in zip(eager.moe_layers(), graphed.moe_layers()):
        assert m0.expert_bias_E.abs().sum() > 0
        torch.testing.assert_close(m1.expert_bias_E, m0.expert_bias_E, rtol=1e-3, atol=1e-5)
    diffs = [float((p1 - p0).detach().abs().max()) for p0, p1 in zip(eager.parameters(), graphed.parameters())]
    print(f"compiled={compiled}: max |Δparam| {max(diffs):.3g}, "
          f"bitwise equal tensors {sum(d == 0 for d in diffs)}/{len(diffs)}, losses {[float(x) for x in graphed_losses]}")
