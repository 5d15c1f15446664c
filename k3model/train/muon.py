"""Per-Head Muon: an orthogonalised momentum update for hidden matrices, one block per attention head,
with AdamW for everything that is not a hidden matrix (Keller Jordan's Muon; Moonlight, arXiv
2502.16982 §2; K3's "Per-Head Muon", report §2.5 as the torchtitan port cites it).

For a hidden matrix W with gradient G_t (per block b of W, see below):

    M_t   = μ M_{t−1} + (1 − μ) G_t                  momentum (torch.optim.Muon's EMA form)
    U_t   = (1 − μ) G_t + μ M_t                       Nesterov
    O_t   = NS₅(U_t)                                  ≈ U Vᵀ of U_t = U S Vᵀ (quintic Newton–Schulz below)
    W_t   = W_{t−1} (1 − η λ) − η · 0.2 √max(A, B) · O_t

    NS₅:  X₀ = U / ‖U‖_F (transposed so that A ≤ B);  Xₖ₊₁ = a Xₖ + (b XₖXₖᵀ + c (XₖXₖᵀ)²) Xₖ,
          (a, b, c) = (3.4445, −4.7750, 2.0315), five steps (Keller Jordan; torch.optim.Muon's defaults).

An orthogonal A×B matrix has RMS 1/√max(A, B), so the factor 0.2 √max(A, B) gives every block an update
of RMS 0.2 — AdamW's typical update RMS — and AdamW's learning rate and weight decay carry over
(Moonlight §2.2, torch's `adjust_lr_fn="match_rms_adamw"`). Weight decay is decoupled (Moonlight §2.1).

Per head: an attention projection is orthogonalised one head's block at a time, not as one matrix,
so one head's large gradient does not set the step of the others (K3 §2.5). The blocks follow how
each layer lays out its heads (k3model/mla.py, kda_layer.py, vision.py):

    rows:H   W [H·d, D] viewed [H, d, D]       q/k/v, gate projections (head-major rows): MLA q_proj / q_up,
                                               kv_up (a head's k_nope and v rows), g_proj; KDA q/k/v/g_proj
    cols:H   W [D, H·d] viewed [H, D, d]       output projections: MLA and KDA o_proj, ViT proj
    rows:3H  ViT qkv [3·H·d, D]                (q, k, v) × head
    stack    W [E, A, B]                       routed experts: each expert's matrix separately
    whole    any other hidden matrix           q_down, kv_down, FFNs, latent projections, MTP merge

AdamW (β = (0.9, 0.95), no decay on 1-D parameters, the same learning rate) takes the embeddings and
the output head (Moonlight keeps both on AdamW), the ViT's patch and position embeddings, every 1-D
parameter (norms, biases, pseudo-queries, KDA's A_log/dt_bias), the depthwise conv kernels, and the
gates whose output is a few scalars: the MoE router (the quantity the balancing bias corrects) and
KDA's β and decay projections (b_proj, f_down, f_up). The MoE balancing bias is a buffer updated by
`k3model.train.common.balance_experts`, untouched by either optimizer.

Newton–Schulz runs in bf16 on CUDA (as Keller Jordan's and torch's) and in fp32 on the CPU, whose
bf16 matmuls are slower than its fp32 ones. Every update is device-side (no host read), so the
optimizer can be built `capturable=True` for `CapturedStep`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn
from torch.optim.adam import adam

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
NS_EPS = 1e-7
RMS_MATCH = 0.2  # Moonlight's update RMS (AdamW's typical one)

# Parameters that stay on AdamW by their module's role, named by the attribute that holds them.
_ADAMW_MATRICES = {"embed", "lm_head", "router", "b_proj", "f_down", "f_up", "patch_embed"}


def newton_schulz(g_NAB: torch.Tensor, steps: int = NS_STEPS,
                  coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
                  dtype: torch.dtype | None = None) -> torch.Tensor:
    """NS₅ of each [A, B] matrix of a [N, A, B] batch (≈ its polar factor U Vᵀ, singular values in
    ≈ [0.7, 1.2]); returned in `g_NAB`'s dtype. `dtype` is the working precision (default: bf16 on
    CUDA, fp32 elsewhere)."""
    if g_NAB.dim() != 3:
        raise ValueError(f"newton_schulz takes a [N, A, B] batch of matrices, got shape {tuple(g_NAB.shape)}")
    a, b, c = coefficients
    work = dtype or (torch.bfloat16 if g_NAB.device.type == "cuda" else torch.float32)
    x = g_NAB.to(work)
    tall = x.shape[1] > x.shape[2]
    if tall:
        x = x.transpose(1, 2)
    # Frobenius norm ≥ spectral norm: every singular value starts in (0, 1], where the iteration works.
    x = x / x.norm(dim=(1, 2), keepdim=True).clamp(min=NS_EPS)
    for _ in range(steps):
        gram = x @ x.transpose(1, 2)
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    if tall:
        x = x.transpose(1, 2)
    return x.to(g_NAB.dtype)


def to_blocks(w: torch.Tensor, layout: str) -> torch.Tensor:
    """`w` as its [N, A, B] blocks (a view) under `layout` ("whole", "stack", "rows:N", "cols:N")."""
    kind, _, n = layout.partition(":")
    if kind == "whole":
        return w.unsqueeze(0)
    if kind == "stack":
        return w
    n = int(n)
    if kind == "rows":
        return w.view(n, w.shape[0] // n, w.shape[1])
    if kind == "cols":
        return w.view(w.shape[0], n, w.shape[1] // n).transpose(0, 1)
    raise ValueError(f"unknown Muon layout {layout!r}: use whole, stack, rows:N or cols:N")


def from_blocks(x_NAB: torch.Tensor, layout: str, shape: torch.Size) -> torch.Tensor:
    """Inverse of `to_blocks` (a new tensor of `shape`)."""
    kind = layout.partition(":")[0]
    if kind == "cols":
        return x_NAB.transpose(0, 1).reshape(shape)
    return x_NAB.reshape(shape)


def check_layout(name: str, p: torch.Tensor, layout: str) -> None:
    kind, _, n = layout.partition(":")
    if kind == "stack":
        ok = p.dim() == 3
    elif kind == "whole":
        ok = p.dim() == 2
    elif kind in ("rows", "cols") and n.isdigit() and int(n) > 0 and p.dim() == 2:
        ok = p.shape[0 if kind == "rows" else 1] % int(n) == 0
    else:
        ok = False
    if not ok:
        raise ValueError(f"parameter {name} of shape {tuple(p.shape)} cannot take Muon layout {layout!r}: "
                         "Muon orthogonalises matrices (2-D, or a stack of them as 3-D) whose head split "
                         "divides the split dimension; leave it to AdamW")


def _head_layouts(model: nn.Module) -> dict[str, str]:
    """Per-head layouts of the attention projections, keyed by parameter name."""
    from k3model.kda_layer import KDALayer
    from k3model.mla import GatedMLA
    from k3model.vision import ViTBlock
    out: dict[str, str] = {}
    for prefix, m in model.named_modules():
        dot = f"{prefix}." if prefix else ""
        if isinstance(m, GatedMLA):
            H = m.cfg.n_heads
            q = "q_proj" if m.cfg.q_rank is None else "q_up"
            out.update({f"{dot}{q}.weight": f"rows:{H}", f"{dot}kv_up.weight": f"rows:{H}",
                        f"{dot}g_proj.weight": f"rows:{H}", f"{dot}o_proj.weight": f"cols:{H}"})
        elif isinstance(m, KDALayer):
            H = m.cfg.n_heads
            out.update({f"{dot}{n}.weight": f"rows:{H}" for n in ("q_proj", "k_proj", "v_proj", "g_proj")})
            out[f"{dot}o_proj.weight"] = f"cols:{H}"
        elif isinstance(m, ViTBlock):
            out.update({f"{dot}qkv.weight": f"rows:{3 * m.n_heads}", f"{dot}proj.weight": f"cols:{m.n_heads}"})
    return out


def muon_layouts(model: nn.Module, names: list[str] | None = None) -> dict[str, str]:
    """{parameter name: Muon layout} for the parameters Muon updates; the rest go to AdamW.

    `names=None` applies the rule in the module docstring. An explicit `names` puts exactly those
    parameters on Muon and raises ValueError naming any it cannot handle: a 1-D parameter, an
    embedding (nn.Embedding or the position table) or a conv kernel."""
    params = dict(model.named_parameters())
    heads = _head_layouts(model)
    embeddings = {f"{n}.weight" if n else "weight" for n, m in model.named_modules() if isinstance(m, nn.Embedding)}
    if names is None:
        chosen = {}
        for name, p in params.items():
            owner = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else ""
            if not p.requires_grad or name in embeddings or owner in _ADAMW_MATRICES:
                continue
            if name.endswith("pos_embed") or "conv" in owner:
                continue
            if p.dim() == 3 and name.split(".")[-1].startswith("w_"):
                chosen[name] = "stack"
            elif p.dim() == 2:
                chosen[name] = heads.get(name, "whole")
        return chosen
    chosen = {}
    for name in names:
        if name not in params:
            raise ValueError(f"no parameter named {name} in the model: name one of its parameters")
        p = params[name]
        if name in embeddings or name.endswith("pos_embed"):
            raise ValueError(f"parameter {name} is an embedding (a lookup table, not a hidden matrix): Muon "
                             "cannot handle it; leave it to AdamW")
        if p.dim() < 2:
            raise ValueError(f"parameter {name} is {p.dim()}-D (shape {tuple(p.shape)}): Muon orthogonalises "
                             "matrices; leave it to AdamW")
        layout = heads.get(name, "stack" if p.dim() == 3 else "whole")
        check_layout(name, p, layout)
        chosen[name] = layout
    return chosen


class PerHeadMuon(torch.optim.Optimizer):
    """Muon on the groups with `kind="muon"` (one layout string per parameter), AdamW on the groups
    with `kind="adamw"`. One optimizer, so `set_lr`, `state_dict`/`load_state_dict` and
    `CapturedStep`'s capturable check work on it as on AdamW. Build it with `build_muon`."""

    def __init__(self, groups: list[dict[str, Any]], lr: float, weight_decay: float = 0.1,
                 betas: tuple[float, float] = (0.9, 0.95), momentum: float = 0.95, eps: float = 1e-8,
                 fused: bool = False, capturable: bool = False):
        if lr <= 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must lie in [0, 1), got {momentum}")
        for g in groups:
            if g.get("kind") not in ("muon", "adamw"):
                raise ValueError(f"each group needs kind 'muon' or 'adamw', got {g.get('kind')!r}")
            if g["kind"] == "muon" and len(g.get("layouts", ())) != len(g["params"]):
                raise ValueError("a muon group needs one layout per parameter")
        defaults = {"lr": lr, "weight_decay": weight_decay, "betas": betas, "momentum": momentum, "eps": eps,
                    "fused": fused, "capturable": capturable}
        super().__init__(groups, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["kind"] == "muon":
                self._muon_group(group)
            else:
                self._adamw_group(group)
        return loss

    def _muon_group(self, group: dict[str, Any]) -> None:
        lr, wd, mu = group["lr"], group["weight_decay"], group["momentum"]
        # Blocks of one shape (after turning tall ones wide) run through Newton–Schulz as one batch:
        # a few batched matmuls instead of a loop of small ones per parameter; each block's result is
        # its own (the iteration never mixes the matrices of a batch).
        pending: dict[tuple, list[tuple[torch.Tensor, str, torch.Tensor, bool]]] = {}
        for p, layout in zip(group["params"], group["layouts"]):
            if p.grad is None:
                continue
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buf = state["momentum_buffer"]
            buf.lerp_(p.grad, 1 - mu)
            g_NAB = to_blocks(p.grad.lerp(buf, mu), layout)
            tall = g_NAB.shape[1] > g_NAB.shape[2]
            if tall:
                g_NAB = g_NAB.transpose(1, 2)
            pending.setdefault((tuple(g_NAB.shape[1:]), g_NAB.dtype, g_NAB.device), []).append((p, layout, g_NAB, tall))
        for (shape_AB, _, _), items in pending.items():
            o_NAB = newton_schulz(torch.cat([g for _, _, g, _ in items]))
            scale = RMS_MATCH * math.sqrt(max(shape_AB))
            for (p, layout, g, tall), o in zip(items, o_NAB.split([g.shape[0] for _, _, g, _ in items])):
                p.mul_(1 - lr * wd)
                p.add_(from_blocks(o.transpose(1, 2) if tall else o, layout, p.shape), alpha=-lr * scale)

    def _adamw_group(self, group: dict[str, Any]) -> None:
        params, grads, avgs, sqs, steps = [], [], [], [], []
        on_device = group["fused"] or group["capturable"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "step" not in state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device if on_device else "cpu")
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            params.append(p)
            grads.append(p.grad)
            avgs.append(state["exp_avg"])
            sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        if not params:
            return
        beta1, beta2 = group["betas"]
        adam(params, grads, avgs, sqs, [], steps, fused=group["fused"] or None,
             foreach=None if group["fused"] else False, capturable=group["capturable"],
             decoupled_weight_decay=True, amsgrad=False, beta1=beta1, beta2=beta2,
             lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)


def build_muon(model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.95),
               muon_names: list[str] | None = None, capturable: bool = False) -> PerHeadMuon:
    """Per-Head Muon for `model`: `muon_layouts(model, muon_names)` on Muon (decayed), 2-D+ AdamW
    parameters decayed, 1-D ones not (as `common.build_optimizer`'s AdamW)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    layouts = muon_layouts(model, muon_names)
    muon = [(n, p) for n, p in named if n in layouts]
    rest = [p for n, p in named if n not in layouts]
    device = named[0][1].device.type if named else "cpu"
    groups = [{"kind": "muon", "params": [p for _, p in muon], "layouts": [layouts[n] for n, _ in muon],
               "weight_decay": weight_decay},
              {"kind": "adamw", "params": [p for p in rest if p.dim() >= 2], "weight_decay": weight_decay},
              {"kind": "adamw", "params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0}]
    return PerHeadMuon([g for g in groups if g["params"]], lr=lr, weight_decay=weight_decay, betas=betas,
                       fused=device in ("cpu", "cuda"), capturable=capturable)
