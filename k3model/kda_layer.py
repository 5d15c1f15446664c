"""The Kimi Delta Attention layer (Kimi Linear report §4, Eq. 10; K3 changes per research/kda.md §1).

    q, k = L2Norm(SiLU(ShortConv(W_q x))), L2Norm(SiLU(ShortConv(W_k x)))
    v    = SiLU(ShortConv(W_v x))
    β    = sigmoid(W_β x)                                     one scalar per head and token
    g    = lb · sigmoid(exp(A) · (W_f↑ W_f↓ x + dt_bias))       per-channel log decay in (lb, 0), lb = −5
    o    = KDA(q, k, v, g, β)                                 delta rule, fixed-size state per head
    y    = W_o( sigmoid(W_g x) ⊙ RMSNorm_head(o) )            full-rank sigmoid output gate (K3)

The lower-bounded ("safe") gate keeps every per-token decay above e^{lb}, which keeps the chunked
kernels' exponents in fp32 range. No positional encoding: order enters through the recurrence and
the short convolution. The state is O(1) in sequence length: conv states plus one K×V matrix per head.
Legend: B batch, T tokens, D model width, H heads, K = V head width, X = H·K channels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from k3model.common import RMSNorm, ShortConv, sigmoid_vectorized
from k3model.config import KDAConfig
from kernels.kda import chunk_kda
from kernels.kda.cpu import kda_cpu, kda_cpu_backend, kda_l2_norm_cpu, kda_output_gate_cpu
from kernels.short_conv import short_conv_silu_l2

try:
    from kernels.kda.decode import kda_recurrent_triton
except ImportError:  # a CPU-only install without triton
    kda_recurrent_triton = None


def kda_step(q_BHK, k_BHK, v_BHV, g_BHK, beta_BH, state_BHKV):
    """One token of KDA (kernels/kda/naive.py's recurrence, scale 1/√K) as broadcasts and sums:
    at decode sizes einsum's reshapes and batched matmuls cost more than the arithmetic, and each
    row's numbers stay independent of the batch. Returns (o [B, H, V], the new state)."""
    S_BHKV = state_BHKV * g_BHK.exp().unsqueeze(-1)
    predicted_BHV = (k_BHK.unsqueeze(-1) * S_BHKV).sum(-2)
    v_new_BHV = beta_BH.unsqueeze(-1) * (v_BHV - predicted_BHV)
    S_BHKV = S_BHKV + k_BHK.unsqueeze(-1) * v_new_BHV.unsqueeze(-2)
    o_BHV = ((q_BHK * q_BHK.shape[-1] ** -0.5).unsqueeze(-1) * S_BHKV).sum(-2)
    return o_BHV, S_BHKV


@dataclass
class KDAState:
    """Per-layer inference state: the three conv windows and the recurrent matrix."""
    conv_q: torch.Tensor  # [B, H·K, W−1]
    conv_k: torch.Tensor
    conv_v: torch.Tensor
    recurrent: torch.Tensor  # [B, H, K, V] fp32
    # Rollback support (k3model/cache.py): with keep_positions, a multi-token forward also returns
    # the states after each of its tokens but the last, in `positions` (a list of KDAStates, or a
    # VerifyPositions that builds one on demand).
    keep_positions: bool = False
    positions: "list | VerifyPositions | None" = field(default=None, repr=False)


@dataclass
class VerifyPositions:
    """The states after each token but the last of a multi-token forward into a recording cache (a
    speculative verify on the CPU), built only for a position that a rollback asks for: the recurrence
    replayed over the kept tokens from the state before the forward (one C call, the same per-token
    arithmetic as the forward's), the conv windows sliced from [window before; the projected inputs].
    Most rounds roll back once or not at all, so this is cheaper than keeping every position's state
    (docs/log/speculative.md). `state(t)`: the state after token t (0-based) of that forward."""
    layer: "KDALayer"
    before: KDAState
    # The conv inputs W_q x, W_k x, W_v x [B, T, H·K] as the forward projected them (kept, not
    # recomputed: a GEMM's bits depend on its rows, and on whether it ran fused; k3model/fused.py).
    projected: tuple
    inputs: tuple  # q, k, v, g [B, T, H, K] and beta [B, T, H] of the forward, as the recurrence took them

    def __len__(self) -> int:
        return self.projected[0].shape[1] - 1

    def state(self, t: int) -> KDAState:
        W = self.layer.cfg.conv_kernel
        _, recurrent = kda_cpu(*(x[:, : t + 1] for x in self.inputs), initial_state=self.before.recurrent,
                               output_final_state=True)
        windows = [torch.cat([s.to(c.dtype), c[:, : t + 1].transpose(1, 2)], dim=2)[:, :, -(W - 1):]
                   for s, c in zip((self.before.conv_q, self.before.conv_k, self.before.conv_v), self.projected)]
        return KDAState(*windows, recurrent)


def _l2_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """F.normalize(x, dim=-1, eps): x / max(‖x‖, eps), as x · rsqrt(max(Σx², eps²)) — the same value
    in half the elementwise passes of F.normalize's norm, clamp, expand and divide (forward and backward)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True).clamp_min(eps * eps))


class KDALayer(nn.Module):
    def __init__(self, cfg: KDAConfig):
        super().__init__()
        self.cfg = cfg
        H, K = cfg.n_heads, cfg.head_dim
        inner = H * K
        self.q_proj = nn.Linear(cfg.d_model, inner, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, inner, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, inner, bias=False)
        self.q_conv = ShortConv(inner, cfg.conv_kernel)
        self.k_conv = ShortConv(inner, cfg.conv_kernel)
        self.v_conv = ShortConv(inner, cfg.conv_kernel)
        # Low-rank decay projection, rank = head width (fla `f_proj`).
        self.f_down = nn.Linear(cfg.d_model, K, bias=False)
        self.f_up = nn.Linear(K, inner, bias=False)
        self.A_log = nn.Parameter(torch.zeros(H))
        # Initial per-token decay rates −g log-uniform in [1e-3, 1e-1]: memories of ~10 to ~1000 tokens.
        rate = torch.exp(torch.empty(inner).uniform_(math.log(1e-3), math.log(1e-1)))
        self.dt_bias = nn.Parameter(torch.logit(rate / -cfg.gate_lower_bound))
        self.b_proj = nn.Linear(cfg.d_model, H, bias=False)
        self.g_proj = nn.Linear(cfg.d_model, inner, bias=True)
        self.o_norm = RMSNorm(K, eps=cfg.norm_eps)
        self.o_proj = nn.Linear(inner, cfg.d_model, bias=False)

    def empty_state(self, batch: int, device, dtype) -> KDAState:
        H, K, W = self.cfg.n_heads, self.cfg.head_dim, self.cfg.conv_kernel
        conv = lambda: torch.zeros(batch, H * K, W - 1, device=device, dtype=dtype)  # noqa: E731
        return KDAState(conv(), conv(), conv(), torch.zeros(batch, H, K, K, device=device, dtype=torch.float32))

    @staticmethod
    def _conv_windows(state: KDAState, projected: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        """[the conv window before a multi-token forward; its projected inputs (q, k, v [B, T, H·K])]
        [B, H·K, W − 1 + T] each: the window after token t is [..., t + 1 : t + W]."""
        return [torch.cat([s.to(c.dtype), c.transpose(1, 2)], dim=2)
                for s, c in zip((state.conv_q, state.conv_k, state.conv_v), projected)]

    def in_projections(self, x_BTD: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Everything the layer projects x to, in this order: W_q x, W_k x, W_v x [B, T, H·K], the
        decay's low-rank W_f↓ x [B, T, K], β's logits W_β x [B, T, H] and the output gate's logits
        W_g x + b_g [B, T, H·K]. Six GEMMs of one input: k3model/fused.py serves them as one."""
        return (self.q_proj(x_BTD), self.k_proj(x_BTD), self.v_proj(x_BTD), self.f_down(x_BTD),
                self.b_proj(x_BTD), self.g_proj(x_BTD))

    def decay(self, f_low_BTK: torch.Tensor) -> torch.Tensor:
        """Per-token, per-channel log decay g ∈ (lb, 0) [B, T, H, K] from f_low = W_f↓ x."""
        B, T, _ = f_low_BTK.shape
        H, K = self.cfg.n_heads, self.cfg.head_dim
        z = (self.f_up(f_low_BTK).float() + self.dt_bias.float()).view(B, T, H, K)
        return self.cfg.gate_lower_bound * torch.sigmoid(self.A_log.float().exp().view(H, 1) * z)

    def forward(self, x_BTD: torch.Tensor, state: KDAState | None = None) -> tuple[torch.Tensor, KDAState | None]:
        """With `state` None: a training/prefill call that returns no state unless asked via `state`."""
        B, T, _ = x_BTD.shape
        H, K = self.cfg.n_heads, self.cfg.head_dim
        cq, ck, cv = (None, None, None) if state is None else (state.conv_q, state.conv_k, state.conv_v)
        *projected, f_low_BTK, beta_logits_BTH, gate_logits_BTX = self.in_projections(x_BTD)
        if state is None and x_BTD.is_cuda:
            # Training on CUDA: conv, SiLU and the L2 norm of q and k in one Triton pass each way
            # (kernels/short_conv/triton.py), out in the projections' dtype: under autocast the dtype
            # chunk_kda takes below, else cast to fp32 as the two-step form gives.
            qk_dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else torch.float32
            eps = self.cfg.norm_eps
            q_BTHK = short_conv_silu_l2(projected[0], self.q_conv.weight, K, eps).view(B, T, H, K).to(qk_dtype)
            k_BTHK = short_conv_silu_l2(projected[1], self.k_conv.weight, K, eps).view(B, T, H, K).to(qk_dtype)
            v, new_cv = self.v_conv(projected[2])
            c_path = False
        else:
            q, new_cq = self.q_conv(projected[0], cq)
            k, new_ck = self.k_conv(projected[1], ck)
            v, new_cv = self.v_conv(projected[2], cv)
            # K = V here: the C kernels of kernels/kda/cpu.py (the device test first: no graph break on CUDA)
            c_path = q.device.type == "cpu" and kda_cpu_backend(q.view(B, T, H, K)) == "c"
            l2_normalize = kda_l2_norm_cpu if c_path else _l2_normalize
            q_BTHK = l2_normalize(q.view(B, T, H, K).float(), self.cfg.norm_eps)
            k_BTHK = l2_normalize(k.view(B, T, H, K).float(), self.cfg.norm_eps)
        g_BTHK = self.decay(f_low_BTK)
        v_BTHK = v.view(B, T, H, K).float()
        beta_BTH = sigmoid_vectorized(beta_logits_BTH.float())

        positions = None
        if state is not None and (T == 1 or state.keep_positions) and x_BTD.is_cuda and kda_recurrent_triton is not None:
            # A decode step, or a speculative verify into a recording cache, on CUDA: the recurrence
            # in one Triton launch for any T, which gives each token the bits a one-token call gives
            # it (kernels/kda/decode.py), and for a verify the state after every token.
            o_BTHK, recurrent, kept = kda_recurrent_triton(q_BTHK, k_BTHK, v_BTHK, g_BTHK, beta_BTH,
                                                           state.recurrent.contiguous(), keep_states=T > 1)
            if T > 1:
                windows = self._conv_windows(state, projected)
                W = self.cfg.conv_kernel
                positions = [KDAState(*(w[:, :, t + 1: t + W] for w in windows), kept[t]) for t in range(T - 1)]
        elif state is not None and T == 1:
            o_BHK, recurrent = kda_step(q_BTHK[:, 0], k_BTHK[:, 0], v_BTHK[:, 0], g_BTHK[:, 0],
                                               beta_BTH[:, 0], state.recurrent)
            o_BTHK = o_BHK.unsqueeze(1)
        elif state is not None and state.keep_positions and c_path:
            # A speculative verify into a recording cache: the T tokens in one call of the C
            # recurrence; the state after an earlier token is rebuilt only if the cache rolls back to it.
            o_BTHK, recurrent = kda_cpu(q_BTHK, k_BTHK, v_BTHK, g_BTHK, beta_BTH, initial_state=state.recurrent,
                                        output_final_state=True)
            positions = VerifyPositions(self, state, tuple(projected), (q_BTHK, k_BTHK, v_BTHK, g_BTHK, beta_BTH))
        elif state is not None and state.keep_positions:
            # The same on other devices: the decode step token by token, keeping every position's
            # state (recurrent matrix and the three conv windows) for rollback.
            recurrent, outs, positions = state.recurrent, [], []
            windows = self._conv_windows(state, projected)
            W = self.cfg.conv_kernel
            for t in range(T):
                # Contiguous slices: the step's reductions then run over the same layout as a decode
                # step's (on CUDA a strided operand can change their order, and so the last bits).
                o_BHK, recurrent = kda_step(*(x[:, t].contiguous() for x in (q_BTHK, k_BTHK, v_BTHK, g_BTHK, beta_BTH)),
                                            recurrent)
                outs.append(o_BHK)
                if t < T - 1:
                    positions.append(KDAState(*(w[:, :, t + 1: t + W] for w in windows), recurrent))
            o_BTHK = torch.stack(outs, dim=1)
        else:
            if x_BTD.is_cuda and torch.is_autocast_enabled("cuda"):
                # The chunk kernels take the autocast dtype (bf16), as fla's callers pass it; fp32
                # inputs would double their tiles. Gates, state and accumulators stay fp32.
                low = torch.get_autocast_dtype("cuda")
                q_BTHK, k_BTHK, v_BTHK, beta_BTH = (t.to(low) for t in (q_BTHK, k_BTHK, v_BTHK, beta_BTH))
            # On the CPU the C recurrence (kernels/kda/cpu.py: fewer operations than the chunked form
            # at these head widths), else the chunked kernels.
            kda = kda_cpu if x_BTD.device.type == "cpu" else chunk_kda
            o_BTHK, recurrent = kda(q_BTHK, k_BTHK, v_BTHK, g_BTHK, beta_BTH,
                                    initial_state=None if state is None else state.recurrent,
                                    output_final_state=state is not None)
        if c_path and x_BTD.dtype == torch.float32:
            # The per-head RMSNorm and the sigmoid gate in one C pass each way (kernels/kda/output_gate_cpu.c).
            gated_BTHK = kda_output_gate_cpu(o_BTHK, gate_logits_BTX.view(B, T, H, K), self.o_norm.weight,
                                             self.o_norm.eps)
        else:
            gated_BTHK = torch.sigmoid(gate_logits_BTX).view(B, T, H, K) * self.o_norm(o_BTHK.to(x_BTD.dtype))
        y_BTD = self.o_proj(gated_BTHK.reshape(B, T, H * K))
        new_state = None if state is None else KDAState(new_cq, new_ck, new_cv, recurrent, positions=positions)
        return y_BTD, new_state
