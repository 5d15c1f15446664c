"""Inputs and the torch reference for the MoE row ops (kernels/moe_rows): LatentMoE's own
index_select / index_add formula (k3model/moe.py), run on float64 copies."""

from __future__ import annotations

import torch


def make_routing(M: int, K: int, E: int, gen: torch.Generator, device="cpu"):
    """Random distinct top-K experts per token, sorted by expert as LatentMoE sorts them:
    (order_R, token_R, inv_MK)."""
    ids_MK = torch.rand(M, E, generator=gen).argsort(-1)[:, :K].to(device)
    order_R = torch.argsort(ids_MK.reshape(-1), stable=True)
    token_R = order_R // K
    inv_MK = torch.empty_like(order_R).scatter_(0, order_R, torch.arange(M * K, device=device)).view(M, K)
    return order_R, token_R, inv_MK


def make_inputs(M: int, K: int, L: int, dtype: torch.dtype, seed: int, device="cpu"):
    """z [M, L], y [R, L] in `dtype`, p [M, K] fp32 > 0, the incoming gradients dz_R [R, L] and du [M, L]
    in `dtype`, and the routing."""
    gen = torch.Generator().manual_seed(seed)
    order_R, token_R, inv_MK = make_routing(M, K, 3 * K, gen, device)
    z = torch.randn(M, L, generator=gen).to(dtype).to(device)
    y = torch.randn(M * K, L, generator=gen).to(dtype).to(device)
    p = torch.rand(M, K, generator=gen).add_(0.1).to(device)
    dz_R = torch.randn(M * K, L, generator=gen).to(dtype).to(device)
    du = torch.randn(M, L, generator=gen).to(dtype).to(device)
    return dict(z=z, y=y, p=p, dz_R=dz_R, du=du, order_R=order_R, token_R=token_R, inv_MK=inv_MK)


def reference(t: dict) -> dict:
    """The module's formula in float64: z_R = z[token], u = index_add(y · p[order]) and autograd's
    gradients for the given dz_R and du."""
    z = t["z"].double().requires_grad_(True)
    y = t["y"].double().requires_grad_(True)
    p = t["p"].double().requires_grad_(True)
    M, K = p.shape
    z_R = z.index_select(0, t["token_R"])
    z_R.backward(t["dz_R"].double())
    w_R1 = p.reshape(-1)[t["order_R"]].unsqueeze(-1)
    u = torch.zeros(M, y.shape[1], dtype=torch.float64, device=y.device).index_add(0, t["token_R"], y * w_R1)
    u.backward(t["du"].double())
    return dict(z_R=z_R.detach(), dz=z.grad, u=u.detach(), dy=y.grad, dp=p.grad)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
