"""LatentMoE with SiTU-GLU experts and aux-loss-free load balancing (K3 report §2.3, Eqs 11–14).

Routing (DeepSeek-V3 §2.1.2 style, sigmoid affinities, router in fp32):

    s_ME   = sigmoid(x_MD W_rᵀ)                       affinities, in fp32
    I_m    = top-k_j (s_mj + b_j)                     selection on the *biased* scores
    p_mj   = routed_scale · s_mj / Σ_{i∈I_m} s_mi     gate weights from the *unbiased* scores, j ∈ I_m

Stable LatentMoE (Eq. 11): the routed experts run in one down-projected latent shared by all of
them, the shared experts at full width:

    z_ML   = W_down x_MD
    u_ML   = Σ_{j∈I_m} p_mj · E_j(z_ML),              E_j(z) = W2_j SiTU-GLU(W1_j z, W3_j z)
    y_MD   = Σ_shared S(x_MD) + W_up RMSNorm(u_ML)

SiTU-GLU (Eq. 12), in fp32; with β1 = 4, β2 = 25 the product is bounded by 100:

    SiTU-GLU(g, v) = β1·tanh(g/β1)·sigmoid(g) · β2·tanh(v/β2)

The bias b is a buffer, not a parameter: no gradient, never seen by the optimizer or weight decay
(DeepSeek-V3 #761). `update_bias()` runs after each optimizer step on the statistics gathered by the
training forwards since the previous call:

  "quantile" (K3 Quantile Balancing, §2.3.3, Eqs 13–14). Each token also finds its (k+1)-th biased
      score α_m, the cutoff; the margin of expert j is m_mj = s_mj − α_m. With the current b, token m
      picks j exactly when m_mj + b_j > 0, so the bias that gives expert j a k/N share of the tokens is

          b_j ← −quantile_{1−k/N}(m_·j),   then b ← b − mean(b)

      and the new bias overwrites the old one (K3: no step size). With `quantile_window_tokens` W > 0
      the step is damped by the tokens M the statistics came from,

          b_j ← b_j − η·quantile_{1−k/N}(m_·j + b_j),   η = min(1, M / W),

      so the bias is an exponential average of the solutions of the last ≈ W tokens rather than the
      last step's alone: at K3's millions of tokens a step η = 1 (the overwrite); where a step is a
      few thousand tokens of one or two rows, one step's solution carries that batch's rows into every
      later token the checkpoint routes (docs/log/pretrain.md, 2026-12-06). It is computed as the same number
      b_j − quantile_{1−k/N}(m_·j + b_j): the biased margins sit around the threshold 0 whatever the
      bias, so one fixed histogram range fits. The quantile is exact (torch.quantile) or, as at
      scale, read off a per-expert histogram (512 bins over [−1, 1], summable across ranks by one
      all-reduce) with linear interpolation inside the crossing bin; snapping to bin edges leaves a
      load CV of ~0.23 (research/recipe.md §1).
  "deepseek" (loss-free balancing): b_j ← b_j + γ·sign(mean_load − load_j), then b ← b − mean(b);
      recentring keeps the bias from drifting large against the scores (torchtitan #1506).
  "none": the bias stays where it is.

`freeze_bias = True` (RL, where router replay makes bias updates misleading: prime-rl #2953) turns
`update_bias()` into a no-op and stops gathering statistics.

QAT (report §4.1.4, research/recipe.md §7b): with `cfg.qat` the routed experts' weights are
fake-quantized to MXFP4 and their matmul inputs to MXFP8 on every forward, with a straight-through
estimator  w_q = w + sg(fq(w) − w)  (the fp32 master weights train). Router, latent projections and
shared experts stay in high precision. MX blocks of 32 run along the reduction (last) dimension, so
latent_dim and expert_hidden must be multiples of 32.

Legend: B batch, T time, D d_model, M = B·T flattened tokens, E routed experts, K top-k,
R = M·K routed (token, expert) pairs, L latent width, H expert hidden, F dense hidden, X histogram bins.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from k3model.common import RMSNorm, sigmoid_vectorized
from k3model.config import MoEConfig
# Training on CUDA: the rows between tokens and experts without atomics (None without triton).
from kernels.moe_rows import combine_rows, dispatch_rows
# On the CPU one fused C pass forward and one backward, else the torch formula (kernels/situ_glu).
from kernels.situ_glu import situ_glu

BALANCING_MODES = ("quantile", "deepseek", "none")
QUANTILE_METHODS = ("histogram", "exact")
MX_BLOCK = 32
# K3's margin histogram: 512 bins over [−1, 1]. Biased margins m + b sit around the selection
# threshold 0 whatever the bias, and sigmoid scores differ by less than 1, so the quantile falls
# inside; if it ever fell in an edge bin, one update would move a bias by at most ~1.
HIST_BINS = 512
HIST_RANGE = (-1.0, 1.0)
LATENT_NORM_EPS = 1e-6
# CPU inference with at most this many (token, expert) products runs every expert densely (decode).
DENSE_DECODE_MAX_ROWS = 1024


def count_per_expert(ids_R: torch.Tensor, n_experts: int) -> torch.Tensor:
    """bincount(ids, minlength=n_experts) without its host synchronisation on CUDA (bincount reads
    the largest id back to size its output), so a decode step can be captured in a CUDA graph."""
    return torch.zeros(n_experts, dtype=torch.long, device=ids_R.device).scatter_add_(0, ids_R, torch.ones_like(ids_R))


def _looped_experts(z_RL, counts_E, w_gate_EHL, w_up_EHL, w_down_ELH, glu, act):
    """Rows sorted by expert (counts_E rows each) through their experts, one matmul per expert and
    projection, SiTU-GLU once over all R rows (it is elementwise: the same numbers as per expert).
    On the CPU the per-expert elementwise calls were most of the layer's operations (issue 17).
    The matmuls stay one per projection, bit for bit those of the expert-parallel path.
    Rows and weights are cut with split/unbind, not slices: a slice's backward writes its gradient
    into a zero tensor of the whole input, once per expert (24 full-size fills and sums a layer);
    split's and unbind's backwards concatenate and stack, the same numbers."""
    counts = counts_E.tolist()
    experts = [e for e, n in enumerate(counts) if n > 0]
    z_parts = [p for p in z_RL.split(counts) if p.shape[0] > 0]
    w_gate, w_up, w_down = w_gate_EHL.unbind(0), w_up_EHL.unbind(0), w_down_ELH.unbind(0)
    gates = [z_nL @ w_gate[e].t() for e, z_nL in zip(experts, z_parts)]
    ups = [z_nL @ w_up[e].t() for e, z_nL in zip(experts, z_parts)]
    h_RH = act(glu(torch.cat(gates, 0), torch.cat(ups, 0)))
    h_parts = h_RH.split([counts[e] for e in experts])
    return torch.cat([h_nH @ w_down[e].t() for e, h_nH in zip(experts, h_parts)], 0)


# Inference on CUDA runs the router's GEMM over at least this many rows (see LatentMoE.route).
ROUTER_MIN_ROWS = 64


def sum_per_token(rows_RL: torch.Tensor, token_R: torch.Tensor, M: int, order_R: torch.Tensor | None = None):
    """u_ML[m] = the sum of token m's K rows (row r belongs to token token_R[r]; `order_R` is the
    permutation that sorted the token-major rows by expert, None if they are token-major). An
    index_add, which adds in row order on the CPU. On CUDA index_add (and Inductor's lowering of it)
    adds with atomics in no fixed order, so a token's sum changes in its last bits from call to call
    and a captured decode step drifts from the eager one: inference there puts the rows back in
    token-major order and sums each token's K in slot order. Training on CUDA does not come here: it
    sums in slot order in a Triton kernel whose backward has no atomics either (kernels/moe_rows)."""
    if not rows_RL.is_cuda or torch.is_grad_enabled():
        return torch.zeros(M, rows_RL.shape[-1], dtype=rows_RL.dtype, device=rows_RL.device).index_add(
            0, token_R, rows_RL)
    if order_R is not None:
        unsort_R = torch.empty_like(order_R).scatter_(0, order_R, torch.arange(len(order_R), device=order_R.device))
        rows_RL = rows_RL.index_select(0, unsort_R)
    return rows_RL.view(M, -1, rows_RL.shape[-1]).sum(1)


def _grouped_experts(z_RL, counts_E, w_gate_EHL, w_up_EHL, w_down_ELH, glu, act):
    """The same as `_looped_experts` with one grouped GEMM per projection (`torch._grouped_mm`, the
    op torchtitan's MoE uses): the expert boundaries stay on the device. Under autocast the
    operands take the autocast dtype, as a Linear's would (the op is not autocast-aware)."""
    dtype = z_RL.dtype
    if z_RL.is_cuda and torch.is_autocast_enabled("cuda"):
        dtype = torch.get_autocast_dtype("cuda")
    z_RL = z_RL.to(dtype)
    offs_E = torch.cumsum(counts_E, 0).to(torch.int32)

    def mm(x_RI, w_EOI):
        return torch._grouped_mm(x_RI, w_EOI.to(dtype).transpose(-2, -1), offs=offs_E)

    h_RH = glu(mm(z_RL, w_gate_EHL), mm(z_RL, w_up_EHL))
    return mm(act(h_RH).to(dtype), w_down_ELH)


class DenseFFN(nn.Module):
    """y = W2 SiTU-GLU(W1 x, W3 x): the first (dense) layer's FFN and the shared experts."""

    def __init__(self, d_model: int, hidden: int, beta1: float = 4.0, beta2: float = 25.0):
        super().__init__()
        if d_model < 1 or hidden < 1:
            raise ValueError(f"DenseFFN needs d_model ≥ 1 and hidden ≥ 1, got {d_model} and {hidden}")
        self.beta1 = beta1
        self.beta2 = beta2
        self.w_gate = nn.Linear(d_model, hidden, bias=False)
        self.w_up = nn.Linear(d_model, hidden, bias=False)
        self.w_down = nn.Linear(hidden, d_model, bias=False)

    def in_projections(self, x_BTD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(W1 x, W3 x) [B, T, F]: two GEMMs of one input, which k3model/fused.py serves as one."""
        return self.w_gate(x_BTD), self.w_up(x_BTD)

    def down(self, gate_BTF: torch.Tensor, up_BTF: torch.Tensor) -> torch.Tensor:
        """W2 SiTU-GLU(gate, up): the FFN after its input projections."""
        return self.w_down(situ_glu(gate_BTF, up_BTF, self.beta1, self.beta2))

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        return self.down(*self.in_projections(x_BTD))


def ffn_param_count(d_model: int, hidden: int) -> int:
    """Parameters of one DenseFFN (gate, up and down projections, no biases)."""
    return 3 * d_model * hidden


def moe_param_counts(cfg: MoEConfig) -> dict[str, int]:
    """Total and active parameters of one LatentMoE layer, computed from the config (nothing allocated).

    Keys: `routed` (all routed experts), `routed_active` (the k a token uses), `shared`, `latent`
    (W_down, W_up and the latent RMSNorm), `router`, `total`, `active`. The bias is a buffer and
    not counted.
    """
    per_expert = ffn_param_count(cfg.latent_dim, cfg.expert_hidden)
    routed = cfg.n_routed * per_expert
    routed_active = cfg.top_k * per_expert
    shared = cfg.n_shared * ffn_param_count(cfg.d_model, cfg.shared_hidden)
    latent = 2 * cfg.d_model * cfg.latent_dim + cfg.latent_dim
    router = cfg.n_routed * cfg.d_model
    return {
        "routed": routed,
        "routed_active": routed_active,
        "shared": shared,
        "latent": latent,
        "router": router,
        "total": routed + shared + latent + router,
        "active": routed_active + shared + latent + router,
    }


def quantile_from_histogram(hist_EX: torch.Tensor, q: float, lo: float, hi: float) -> torch.Tensor:
    """Per-row q-quantile of values binned uniformly over [lo, hi], interpolating inside the bin.

    Within the bin where the cumulative count crosses q·n the values are taken as spread evenly, so
    the answer moves continuously with the counts instead of snapping to bin edges.
    """
    n_bins = hist_EX.shape[-1]
    width = (hi - lo) / n_bins
    counts_EX = hist_EX.double()
    cum_EX = counts_EX.cumsum(-1)
    target_E1 = q * cum_EX[:, -1:]
    crossing_E1 = (cum_EX < target_E1).sum(-1, keepdim=True).clamp(max=n_bins - 1)
    in_bin_E1 = counts_EX.gather(-1, crossing_E1)
    before_E1 = cum_EX.gather(-1, crossing_E1) - in_bin_E1
    frac_E1 = ((target_E1 - before_E1) / in_bin_E1.clamp(min=1.0)).clamp(0.0, 1.0)
    return (lo + (crossing_E1 + frac_E1) * width).squeeze(-1).float()


def margin_histogram(margin_ME: torch.Tensor, n_bins: int = HIST_BINS,
                     lo: float = HIST_RANGE[0], hi: float = HIST_RANGE[1]) -> torch.Tensor:
    """Per-expert counts of biased margins in `n_bins` bins (lo + i·w, lo + (i+1)·w] ([E, X], fp32).

    Every token puts exactly one expert, its (k+1)-th, at a biased margin of exactly 0: an atom of
    about 1/N of each expert's column, right at the selection threshold. Bins closed on the right
    with an edge at 0 keep that atom on the "not selected" side; a bin straddling it would spread the
    atom over the bin on interpolation and bias the quantile by up to a bin width, which at 512 bins
    stalled a fixed batch at max/mean 1.085 (16 experts, top-4). Margins outside [lo, hi] land in the
    edge bins; the quantile near the top (1 − k/N) only reaches those for margins beyond ±1.
    """
    bins_EM = (((margin_ME.t() - lo) / (hi - lo) * n_bins).ceil().long() - 1).clamp_(0, n_bins - 1)
    hist_EX = torch.zeros(margin_ME.shape[1], n_bins, device=margin_ME.device)
    return hist_EX.scatter_add_(1, bins_EM, torch.ones_like(bins_EM, dtype=torch.float32))


def _import_fake_quant():
    try:
        from kernels.mx import fake_quant_mx
    except ImportError as err:
        raise ValueError(
            "qat needs kernels.mx (kernels.mx.fake_quant_mx could not be imported); "
            "set qat=False or install the kernels package"
        ) from err
    return fake_quant_mx


class LatentMoE(nn.Module):
    """Routed SiTU-GLU experts in a shared latent + full-width shared experts; see the module docstring.

    After each forward `last_load` holds the tokens per routed expert ([E], float). In training
    mode, with balancing on and the bias not frozen, the forward also accumulates what
    `update_bias()` needs: the loads, and for "quantile" the margin histogram (and the raw margins
    when `quantile_method="exact"`).
    """

    def __init__(self, cfg: MoEConfig, quantile_method: str = "histogram"):
        super().__init__()
        if not 1 <= cfg.top_k <= cfg.n_routed:
            raise ValueError(f"top_k ({cfg.top_k}) must lie in [1, n_routed = {cfg.n_routed}]")
        if cfg.balancing not in BALANCING_MODES:
            raise ValueError(f"balancing must be one of {BALANCING_MODES}, got {cfg.balancing!r}")
        if cfg.balancing == "quantile" and cfg.top_k == cfg.n_routed:
            raise ValueError(
                f"quantile balancing needs top_k < n_routed (the (k+1)-th score is the cutoff), got "
                f"top_k = n_routed = {cfg.n_routed}; lower top_k or set balancing='none'"
            )
        if cfg.quantile_window_tokens < 0:
            raise ValueError(f"quantile_window_tokens must be ≥ 0 (0: K3's overwrite), got {cfg.quantile_window_tokens}")
        if quantile_method not in QUANTILE_METHODS:
            raise ValueError(f"quantile_method must be one of {QUANTILE_METHODS}, got {quantile_method!r}")
        for name in ("d_model", "latent_dim", "expert_hidden"):
            if getattr(cfg, name) < 1:
                raise ValueError(f"MoEConfig.{name} must be ≥ 1, got {getattr(cfg, name)}")
        if cfg.n_shared > 0 and cfg.shared_hidden < 1:
            raise ValueError(f"shared_hidden must be ≥ 1 when n_shared > 0, got {cfg.shared_hidden}")
        self.fake_quant_mx = None
        if cfg.qat:
            for name in ("latent_dim", "expert_hidden"):
                if getattr(cfg, name) % MX_BLOCK:
                    raise ValueError(
                        f"qat quantizes in MX blocks of {MX_BLOCK} along {name}; MoEConfig.{name} = "
                        f"{getattr(cfg, name)} is not a multiple of {MX_BLOCK}: change it or set qat=False"
                    )
            self.fake_quant_mx = _import_fake_quant()

        self.cfg = cfg
        self.quantile_method = quantile_method
        self.freeze_bias = False
        E, D, L, H = cfg.n_routed, cfg.d_model, cfg.latent_dim, cfg.expert_hidden

        self.router = nn.Linear(D, E, bias=False)
        self.register_buffer("expert_bias_E", torch.zeros(E, dtype=torch.float32))
        self.latent_down = nn.Linear(D, L, bias=False)
        self.latent_norm = RMSNorm(L, eps=LATENT_NORM_EPS)
        self.latent_up = nn.Linear(L, D, bias=False)
        # Batched expert weights in nn.Linear's (out, in) layout, so the reduction dimension is last:
        # the dimension MX blocks run along.
        self.w_gate_EHL = nn.Parameter(torch.empty(E, H, L))
        self.w_up_EHL = nn.Parameter(torch.empty(E, H, L))
        self.w_down_ELH = nn.Parameter(torch.empty(E, L, H))
        # n shared experts of hidden F sum to one FFN of hidden n·F (the activation is per unit and
        # the down projection sums over units), so they run as one matmul.
        self.shared = (DenseFFN(D, cfg.n_shared * cfg.shared_hidden, cfg.situ_beta1, cfg.situ_beta2)
                       if cfg.n_shared > 0 else None)
        self.reset_expert_parameters()

        self.last_load = torch.zeros(E)
        self.observing = True  # False while activation checkpointing recomputes a forward
        # Expert matmuls: True = one grouped GEMM per projection (torch._grouped_mm: no host sync, three
        # launches per layer), False = a loop over experts (one matmul each, the counts read on the
        # host); None picks grouped (eager on the CPU). Both give the same result; on the CPU (torch 2.13) the
        # same bits, and the grouped one is the faster (docs/log/tiny.md).
        self.grouped_matmuls: bool | None = None
        self._reset_stats()

    def reset_expert_parameters(self) -> None:
        """nn.Linear's default init, applied per expert: U(−1/√fan_in, 1/√fan_in)."""
        for w in (self.w_gate_EHL, self.w_up_EHL, self.w_down_ELH):
            bound = 1.0 / math.sqrt(w.shape[-1])
            nn.init.uniform_(w, -bound, bound)

    # ------------------------------------------------------------------------------------------
    # Forward

    def route(self, x_MD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Select experts and gate weights.

        Returns (ids_MK, p_MK, cutoff_M, s_ME): chosen experts on the biased scores, gate weights
        from the unbiased ones, the (k+1)-th biased score (None when k = n_routed) and the
        affinities, all in fp32.
        """
        k = self.cfg.top_k
        # fp32 even under autocast: selection compares scores that can differ by less than bf16's
        # resolution, and the bias steps are ~1e-3.
        M = x_MD.shape[0]
        x_MD = x_MD.float()
        if x_MD.is_cuda and not torch.is_grad_enabled() and M < ROUTER_MIN_ROWS:
            # CUDA's fp32 GEMMs pick their kernel by row count, so a token's scores would depend on
            # how many tokens share the call (a decode step's one against a speculative verify's
            # K + 1; probes-archive:benchmarks/probes/op_rows.py), and near ties would pick other experts. Zero
            # rows make every small call the same shape.
            x_MD = torch.cat([x_MD, x_MD.new_zeros(ROUTER_MIN_ROWS - M, x_MD.shape[1])])
        with torch.autocast(device_type=x_MD.device.type, enabled=False):
            s_ME = sigmoid_vectorized(F.linear(x_MD, self.router.weight.float()))[:M]
        biased_ME = s_ME.detach() + self.expert_bias_E.float()
        n_pick = min(k + 1, self.cfg.n_routed)
        top_vals_MP, top_ids_MP = torch.topk(biased_ME, n_pick, dim=-1, sorted=True)
        ids_MK = top_ids_MP[:, :k]
        cutoff_M = top_vals_MP[:, k] if n_pick > k else None
        s_MK = s_ME.gather(-1, ids_MK)
        p_MK = self.cfg.routed_scale * s_MK / s_MK.sum(-1, keepdim=True)
        return ids_MK, p_MK, cutoff_M, s_ME

    def _expert_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.fake_quant_mx is None:
            return self.w_gate_EHL, self.w_up_EHL, self.w_down_ELH
        return tuple(self._fake_quant(w, "fp4_e2m1") for w in (self.w_gate_EHL, self.w_up_EHL, self.w_down_ELH))

    def _fake_quant(self, t: torch.Tensor, fmt: str) -> torch.Tensor:
        """Straight-through fake quantization: forward sees fq(t), backward the identity.

        Non-finite quantized values fall back to the high-precision ones (as in the K3 port).
        """
        t_q = self.fake_quant_mx(t, fmt)
        t_q = torch.where(torch.isfinite(t_q), t_q, t)
        return t + (t_q - t).detach()

    def _expert_act(self, a: torch.Tensor) -> torch.Tensor:
        return a if self.fake_quant_mx is None else self._fake_quant(a, "fp8_e4m3")

    def routed_experts(self, z_ML: torch.Tensor, ids_MK: torch.Tensor, p_MK: torch.Tensor) -> torch.Tensor:
        """u_ML = Σ_{j∈I_m} p_mj E_j(z_m): tokens sorted by expert, the experts' matmuls over their
        contiguous row ranges, then each token's K outputs summed back (index_add on the CPU, slot order
        in CUDA inference, kernels/moe_rows' Triton ops in CUDA training)."""
        M, K = ids_MK.shape
        w_gate_EHL, w_up_EHL, w_down_ELH = self._expert_weights()
        E = self.cfg.n_routed
        if not torch.is_grad_enabled() and not z_ML.is_cuda and M * E <= DENSE_DECODE_MAX_ROWS:
            return self._dense_experts(z_ML, ids_MK, p_MK, w_gate_EHL, w_up_EHL, w_down_ELH)
        ids_R = ids_MK.reshape(-1)
        order_R = torch.argsort(ids_R, stable=True)
        token_R = order_R // K
        counts_E = count_per_expert(ids_R, self.cfg.n_routed)
        # Training on CUDA moves the rows with the atomic-free Triton ops (kernels/moe_rows): the row of
        # token m's slot k is inv_MK[m, k]; elsewhere index_select here and index_add in sum_per_token.
        rows_kernels = z_ML.is_cuda and torch.is_grad_enabled() and dispatch_rows is not None
        if rows_kernels:
            inv_MK = torch.empty_like(order_R).scatter_(0, order_R, torch.arange(M * K, device=order_R.device)).view(M, K)
            z_RL = self._expert_act(dispatch_rows(z_ML, token_R, inv_MK))
        else:
            z_RL = self._expert_act(z_ML.index_select(0, token_R))
        # Under torch.compile on the CPU the loop: torch 2.13's fake-tensor rule for _grouped_mm
        # takes bf16 only (the same bits either way).
        grouped = self.grouped_matmuls if self.grouped_matmuls is not None else \
            z_RL.is_cuda or not torch.compiler.is_compiling()
        experts = _grouped_experts if grouped else _looped_experts
        out_RL = experts(z_RL, counts_E, w_gate_EHL, w_up_EHL, w_down_ELH,
                         lambda g, u: situ_glu(g, u, self.cfg.situ_beta1, self.cfg.situ_beta2), self._expert_act)
        if rows_kernels:
            return combine_rows(out_RL, p_MK.float(), inv_MK, z_ML.dtype)
        weight_R1 = p_MK.reshape(-1)[order_R].unsqueeze(-1)
        return sum_per_token(out_RL.float() * weight_R1, token_R, M, order_R).to(z_ML.dtype)

    def _dense_experts(self, z_ML, ids_MK, p_MK, w_gate_EHL, w_up_EHL, w_down_ELH) -> torch.Tensor:
        """Inference on the CPU with few tokens (decode steps): every expert on every token as three
        batched matmuls, weighted by p (0 for the experts a token did not pick). E/k times the
        arithmetic, but a dozen operations instead of a sort and a loop over experts; each token's
        bits do not depend on the other tokens when M ≥ 4 (the engine's decode batches and
        prefills have that many token rows; k3model/engine.py)."""
        M = z_ML.shape[0]
        E = w_gate_EHL.shape[0]
        z_ML = self._expert_act(z_ML)
        z_EML = z_ML.unsqueeze(0).expand(E, -1, -1)
        h_EMH = situ_glu(torch.bmm(z_EML, w_gate_EHL.transpose(1, 2)), torch.bmm(z_EML, w_up_EHL.transpose(1, 2)),
                         self.cfg.situ_beta1, self.cfg.situ_beta2)
        out_EML = torch.bmm(self._expert_act(h_EMH), w_down_ELH.transpose(1, 2))
        p_ME = torch.zeros(M, E, dtype=torch.float32, device=z_ML.device).scatter_(1, ids_MK, p_MK.float())
        u_ML = (out_EML.float() * p_ME.t().unsqueeze(-1)).sum(0)
        return u_ML.to(z_ML.dtype)

    def in_projections(self, x_MD: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """What the layer projects x to besides the router: the latent W_down x [M, L], then with
        shared experts their (W1 x, W3 x) [M, n_shared·F]. One input: k3model/fused.py serves them as
        one GEMM. The router stays apart: fp32 under autocast, its rows padded on CUDA (`route`)."""
        z_ML = self.latent_down(x_MD)
        return (z_ML,) if self.shared is None else (z_ML, *self.shared.in_projections(x_MD))

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        B, T, D = x_BTD.shape
        x_MD = x_BTD.reshape(B * T, D)
        ids_MK, p_MK, cutoff_M, s_ME = self.route(x_MD)
        self._observe(ids_MK, cutoff_M, s_ME)

        z_ML, *shared_in = self.in_projections(x_MD)
        u_ML = self.routed_experts(z_ML, ids_MK, p_MK)
        y_MD = self.latent_up(self.latent_norm(u_ML))
        if self.shared is not None:
            y_MD = y_MD + self.shared.down(*shared_in)
        return y_MD.reshape(B, T, D)

    # ------------------------------------------------------------------------------------------
    # Balancing

    def _reset_stats(self) -> None:
        E = self.cfg.n_routed
        device = self.expert_bias_E.device
        acc = getattr(self, "_load_acc_E", None)
        if acc is not None and acc.device == device:
            # Zeroed in place: a training step captured in a CUDA graph (train.common.CapturedStep)
            # replays its kernels on the very tensors it saw, so they must stay the same tensors.
            acc.zero_()
            self._margin_hist_EX.zero_()
        else:
            self._load_acc_E = torch.zeros(E, device=device)
            self._margin_hist_EX = torch.zeros(E, HIST_BINS, device=device)
        self._margins: list[torch.Tensor] = []

    @torch.no_grad()
    def _observe(self, ids_MK: torch.Tensor, cutoff_M: torch.Tensor | None, s_ME: torch.Tensor) -> None:
        if not self.observing:  # a recomputation for activation checkpointing: seen already
            return
        load_E = count_per_expert(ids_MK.reshape(-1), self.cfg.n_routed).float()
        self.last_load = load_E
        if not self.training or self.freeze_bias or self.cfg.balancing == "none":
            return
        if self._load_acc_E.device != load_E.device:
            self._reset_stats()
        self._load_acc_E += load_E
        if self.cfg.balancing != "quantile":
            return
        # The biased margin m_mj + b_j, recomputed with the very expression `route` used, so the
        # token's (k+1)-th expert sits at exactly 0.0 (see margin_histogram for why that matters).
        biased_margin_ME = (s_ME.detach() + self.expert_bias_E.float()) - cutoff_M.unsqueeze(-1)
        self._margin_hist_EX += margin_histogram(biased_margin_ME)
        if self.quantile_method == "exact":
            self._margins.append(biased_margin_ME)

    @torch.no_grad()
    def update_bias(self) -> None:
        """Set the routing bias from the statistics gathered since the last call, then clear them.

        Call after each optimizer step. No-op with balancing "none", with `freeze_bias`, or when no
        training forward ran since the last call.
        """
        if self.freeze_bias or self.cfg.balancing == "none":
            self._reset_stats()
            return
        if self.expert_bias_E.dtype != torch.float32:
            raise ValueError(
                f"expert_bias_E is {self.expert_bias_E.dtype}; keep it in fp32 (bias steps of 1e-3 vanish "
                "in bf16): use autocast for mixed precision rather than module.to(dtype)"
            )
        if self.quantile_method == "exact" and self.cfg.balancing == "quantile" and not self._margins:
            return
        if self.cfg.balancing == "deepseek":
            new_E = self.expert_bias_E + self.cfg.bias_update_rate * torch.sign(
                self._load_acc_E.mean() - self._load_acc_E)
        else:
            # −quantile(m_·j) = b_j − quantile(m_·j + b_j): the quantile is taken of biased margins.
            q = 1.0 - self.cfg.top_k / self.cfg.n_routed
            step_E = self.margin_quantile(q)
            if self.cfg.quantile_window_tokens > 0:
                # η = min(1, M / W) from the loads on the device (k per token): no host read.
                tokens = self._load_acc_E.sum() / self.cfg.top_k
                step_E = step_E * (tokens / self.cfg.quantile_window_tokens).clamp(max=1.0)
            new_E = self.expert_bias_E - step_E
        # No training forward since the last call (nothing loaded): the bias stays. Decided on the
        # device: a host read here would wait for the whole step on CUDA, once per layer, and leave
        # the GPU idle while the next step's first kernels are launched.
        seen = self._load_acc_E.sum() > 0
        self.expert_bias_E.copy_(torch.where(seen, new_E - new_E.mean(), self.expert_bias_E))
        self._reset_stats()

    def margin_quantile(self, q: float) -> torch.Tensor:
        """quantile_q of the biased margins m_·j + b_j gathered since the last update, per expert ([E])."""
        if self.quantile_method == "exact":
            return torch.quantile(torch.cat(self._margins, 0), q, dim=0)
        return quantile_from_histogram(self._margin_hist_EX, q, *HIST_RANGE)

    def load_max_over_mean(self) -> float:
        """max_j load_j / mean_j load_j of the last forward: 1.0 is perfect balance, E/k the worst."""
        mean = self.last_load.mean()
        return float(self.last_load.max() / mean) if mean > 0 else float("nan")


def freeze_router_bias(model: nn.Module) -> None:
    """Stop every LatentMoE's bias updates in `model` (DESIGN.md §4: the router bias is frozen during
    RL, and on-policy distillation is RL too)."""
    for moe in model.modules():
        if isinstance(moe, LatentMoE):
            moe.freeze_bias = True
