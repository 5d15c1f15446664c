"""The CPU's default expert matmuls (torch._grouped_mm in eager code) give the expert loop's bits:
the expert-parallel path (one matmul per local expert) and the engine's batch-equals-single property
rely on a token's numbers being those of its experts' own matmuls."""

import pytest
import torch

from k3model.config import get_profile
from k3model.moe import LatentMoE


def _step(moe: LatentMoE, x_BTD: torch.Tensor, grouped: bool | None) -> list[torch.Tensor]:
    moe.grouped_matmuls = grouped
    moe.zero_grad(set_to_none=True)
    xg = x_BTD.clone().requires_grad_(True)
    y = moe(xg)
    y.square().sum().backward()
    return [y.detach(), xg.grad] + [p.grad for _, p in sorted(moe.named_parameters())]


@pytest.mark.parametrize("rows", [(8, 64), (3, 5)])
def test_cpu_default_expert_matmuls_are_the_loops_bits(rows):
    torch.manual_seed(0)
    moe = LatentMoE(get_profile("tiny").model.moe())
    with torch.no_grad():
        moe.expert_bias_E[:2] = -10.0  # experts 0 and 1 get no token: empty groups
    x = torch.randn(*rows, moe.cfg.d_model)
    default, loop = _step(moe, x, None), _step(moe, x, False)
    assert moe.last_load[:2].sum() == 0
    names = ["y", "dx"] + [n for n, _ in sorted(moe.named_parameters())]
    for name, a, b in zip(names, default, loop):
        assert torch.equal(a, b), name
