"""Chunkwise-parallel KDA in plain torch: the CPU path, differentiable through autograd.

Kimi Linear report §2.1 (Eqs. 3–9); research/kda.md §2. Inside a chunk of C tokens, with the
chunk-local cumulative log decay G_r = Σ_{i≤r} g_i (per key channel):

    A_kk[r, i] = β_r Σ_d k_r[d] k_i[d] exp(G_r[d] − G_i[d])            i < r
    A_qk[r, j] = scale Σ_d q_r[d] k_j[d] exp(G_r[d] − G_j[d])          j ≤ r
    T = (I + A_kk)⁻¹            (UT transform: one unit-lower-triangular solve per chunk)
    W = T (β ⊙ exp(G) ⊙ K),     U = T (β ⊙ V)

and across chunks, S the state entering the chunk:

    V_new = U − W S
    O     = scale (Q ⊙ exp(G)) S + A_qk V_new
    S'    = Diag(exp(G_C)) S + (K ⊙ exp(G_C − G))ᵀ V_new

Numerics: exp(G_r − G_i) is never formed as exp(G_r)·exp(−G_i), which overflows once the decay
inside a chunk passes ~88 nats. The rows are split into blocks of 64, 32 or 16 tokens — the longest
in which no channel decays by more than 80 nats (`_reference_block`; the safe gate's −5 bound always
allows 16) — and each row block factors through a reference point at its first row: both factors
are ≤ 1 for earlier columns and bounded by the block's own decay inside it, so one batched matmul
gives every score (`_row_referenced_scores`). Gates beyond that bound fall back to fla-style
secondary chunking with exact pairwise differences on the diagonal 16×16 blocks
(`_pairwise_decayed_scores`). The UT transform is one triangular solve (`unit_lower_solve`).
Speed at the tiny profile's training shapes (issue 17, docs/log/tiny.md): these cut the CPU KDA
chunk's forward + backward at T = 64 by about 2.5× against the einsum path and the row-by-row
inverse (`unit_lower_inverse`, kept for the benchmarks that compare inverses).
Legend: B batch, H heads, N chunks, S sub-chunks per chunk, c sub-chunk length, C = S·c, K/V widths.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from kernels.kda.naive import check_kda_inputs

logger = logging.getLogger(__name__)

CHUNK = 64
SUB_CHUNK = 16


# exp(x) overflows fp32 at x ≈ 88.7; keep a margin.
MAX_SUB_CHUNK_DECAY = 80.0


def _diagonal_factorization_is_safe(G_BHNScK: torch.Tensor) -> bool:
    """True when every sub-chunk decays by at most MAX_SUB_CHUNK_DECAY nats, so exp(G_first − G_i)
    stays finite. Gates bounded below by −5 (the KDA layer's safe gate) always qualify: 15 × 5 = 75."""
    span = G_BHNScK[..., 0, :] - G_BHNScK[..., -1, :]
    safe = bool(span.max() <= MAX_SUB_CHUNK_DECAY) if span.numel() else True
    if not safe:
        logger.info("chunk_kda_torch: a sub-chunk decays by more than %.0f nats; using exact pairwise "
                    "decays for the diagonal blocks (slower, same result)", MAX_SUB_CHUNK_DECAY)
    return safe


def _pairwise_decayed_scores(a_BHNCK, k_BHNCK, G_BHNCK, include_diagonal: bool) -> torch.Tensor:
    """Σ_d a_r[d] k_i[d] exp(G_r[d] − G_i[d]) for i < r (or i ≤ r): [B, H, N, C, C], zero above."""
    B, H, N, C, K = a_BHNCK.shape
    S, c = C // SUB_CHUNK, SUB_CHUNK
    a = a_BHNCK.reshape(B, H, N, S, c, K)
    k = k_BHNCK.reshape(B, H, N, S, c, K)
    G = G_BHNCK.reshape(B, H, N, S, c, K)

    tri = torch.ones(c, c, dtype=torch.bool, device=a.device)
    tri = tri.tril(0) if include_diagonal else tri.tril(-1)
    if _diagonal_factorization_is_safe(G):
        # Diagonal blocks through a reference point at each sub-chunk's first row: one small matmul.
        G_first = G[..., :1, :]
        diag = (a * (G - G_first).exp()) @ (k * (G_first - G).exp()).transpose(-1, -2)
    else:
        # Exact pairwise differences, clamped to ≤ 0 so masked (upper) entries cannot overflow.
        diff_rik = (G.unsqueeze(-2) - G.unsqueeze(-3)).clamp(max=0.0)  # [B,H,N,S,c(r),c(i),K]
        diag = (a.unsqueeze(-2) * k.unsqueeze(-3) * diff_rik.exp()).sum(-1)
    diag = diag * tri

    # Off-diagonal blocks (a > b): reference point at the last row of sub-chunk b.
    G_end = G[..., -1, :]  # [B,H,N,S(b),K]
    k_right = k * (G_end.unsqueeze(-2) - G).exp()  # [B,H,N,S(b),c(i),K], factors ≤ 1
    to_ref = (G.unsqueeze(-2) - G_end.unsqueeze(-3).unsqueeze(-3)).clamp(max=0.0)  # [B,H,N,S(a),c(r),S(b),K]
    a_left = a.unsqueeze(-2) * to_ref.exp()
    off = torch.einsum("bhnarjk,bhnjik->bhnarji", a_left, k_right)  # [B,H,N,S(a),c(r),S(b),c(i)]
    earlier = torch.ones(S, S, dtype=torch.bool, device=a.device).tril(-1)  # b < a
    off = off * earlier.view(S, 1, S, 1)

    eye_S = torch.eye(S, dtype=a.dtype, device=a.device).view(S, 1, S, 1)
    full = off + eye_S * diag.unsqueeze(-2)  # diagonal blocks placed where a == b
    return full.reshape(B, H, N, C, C)


def _reference_block(G_BHNCK: torch.Tensor) -> int | None:
    """The longest row block (64, 32 or 16 tokens) in which no channel decays by more than
    MAX_SUB_CHUNK_DECAY nats, or None. Gates bounded below by −5 always allow 16 (15 × 5 = 75); the
    weak decays of an untrained or slowly forgetting layer allow the whole chunk, one reference
    point and a quarter of the elementwise work. One host sync, as the old safety check had."""
    C = G_BHNCK.shape[-2]
    spans = [(size, (G_BHNCK.unflatten(-2, (C // size, size))[..., 0, :] -
                     G_BHNCK.unflatten(-2, (C // size, size))[..., -1, :]).amax())
             for size in (C, C // 2, SUB_CHUNK) if size >= SUB_CHUNK and C % size == 0]
    for size, span in zip([z for z, _ in spans], torch.stack([s for _, s in spans]).tolist()):
        if span <= MAX_SUB_CHUNK_DECAY:
            return size
    return None


def _row_referenced_scores(q_BHNCK, k_BHNCK, G_BHNCK, beta_BHNC, scale: float,
                           block: int = SUB_CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """A_qk and A_kk, masked, in one batched matmul: ([B,H,N,C,C], [B,H,N,C,C]).

    Rows in row block a (`block` tokens, from `_reference_block`) factor through one reference
    point, G at a's first row (G_ref):

        Σ_d a_r[d] k_i[d] exp(G_r[d] − G_i[d]) = Σ_d (a_r[d] e^{G_r[d] − G_ref[d]}) (k_i[d] e^{G_ref[d] − G_i[d]})

    For columns i before the block both factors are ≤ 1; inside it the right factor grows to at most
    the block's own decay, which `_reference_block` bounds (the factorization the diagonal blocks of
    `_pairwise_decayed_scores` use). Columns after the block are masked. The row factors carry β
    (A_kk) and the scale (A_qk). This is `_pairwise_decayed_scores` with fewer, larger operations:
    one [2·block, K] × [K, C] product per block instead of the per-block-pair einsum (the CPU
    training step at T = 64 spent most of its KDA time in that einsum's elementwise factors).
    """
    B, H, N, C, K = q_BHNCK.shape
    S, c = C // block, block
    G = G_BHNCK.reshape(B, H, N, S, c, K)
    G_ref = G[..., :1, :]  # [B,H,N,S,1,K]
    to_ref = (G - G_ref).exp()  # rows of block a back to its first row: ≤ 1
    left = torch.cat([q_BHNCK.reshape(B, H, N, S, c, K) * (to_ref * scale),
                      k_BHNCK.reshape(B, H, N, S, c, K) * (to_ref * beta_BHNC.reshape(B, H, N, S, c, 1))],
                     dim=-2)  # [B,H,N,S,2c,K]
    # Column i is used by block a only up to a's last row; the exponent of later columns is
    # zeroed (a multiply: cheaper than a clamp's backward) so they stay finite.
    col_C, row_S1 = torch.arange(C, device=G.device), torch.arange(S, device=G.device).unsqueeze(-1)
    used_SC1 = (col_C < (row_S1 + 1) * c).unsqueeze(-1).to(G.dtype)
    # Built as [.., K, C] (columns innermost): the product and its backward then run on contiguous
    # memory; in [.., C, K] the backward's transposed gradients made these the slowest multiplies.
    k_BHNKC, G_BHNKC = k_BHNCK.transpose(-1, -2).contiguous(), G_BHNCK.transpose(-1, -2).contiguous()
    exponent = (G_ref.transpose(-1, -2) - G_BHNKC.unsqueeze(3)) * used_SC1.transpose(-1, -2)  # [B,H,N,S,K,C]
    right_T = k_BHNKC.unsqueeze(3) * exponent.exp()
    # Row r = a·c + j of the chunk sees columns i ≤ r (A_qk) or i < r (A_kk).
    r_S1c1 = (row_S1 * c + torch.arange(c, device=G.device)).unsqueeze(-1)
    mask_S2cC = torch.stack([col_C <= r_S1c1, col_C < r_S1c1], dim=1).reshape(S, 2 * c, C).to(G.dtype)
    scores = (left @ right_T) * mask_S2cC  # [B,H,N,S,2c,C]
    qk, kk = scores.view(B, H, N, S, 2, c, C).unbind(4)
    return qk.reshape(B, H, N, C, C), kk.reshape(B, H, N, C, C)


def unit_lower_inverse(A_CC: torch.Tensor) -> torch.Tensor:
    """(I + A)⁻¹ for strictly lower-triangular A (batched), blockwise, as fla's solve_tril does:
    forward substitution inside the 16×16 diagonal blocks, then 2×2 block merges 16 → 32 → 64,

        [[X, 0], [L, Y]]⁻¹ = [[X⁻¹, 0], [−Y⁻¹ L X⁻¹, Y⁻¹]].

    Every step multiplies by blocks of the inverse itself, which stay bounded when T does. The shorter
    doubling product (I − A)(I + A²)(I + A⁴)⋯(I + A³²) is not used: it forms A³², whose entries grow
    like binomial coefficients when A_kk's entries are large and of one sign (correlated keys, β near
    1, little decay inside the chunk) and then cancel. A trained tiny model's third KDA layer is in
    that regime (mean g ≈ −0.03): the doubling gave NaN or 8–80× relative output error on held-out
    text, this path 4e-7 (probes-archive:benchmarks/probes/kda_inverse_diag.py); with L2-normalised uniform
    keys and gates logsigmoid(N(0,1) + 5), 0.18 against 6e-7 (tests/kernels/test_kda_torch.py). Differentiable
    through autograd.
    """
    C = A_CC.shape[-1]
    b = min(C, SUB_CHUNK)
    if C % b or (C // b) & (C // b - 1):
        raise ValueError(f"unit_lower_inverse needs C = 16·2^j (or C ≤ 16), got C={C}")
    nb = C // b
    A_blocks = torch.stack([A_CC[..., i * b:(i + 1) * b, i * b:(i + 1) * b] for i in range(nb)], dim=-3)
    eye = torch.eye(b, dtype=A_CC.dtype, device=A_CC.device)
    rows = [eye[0].expand(*A_blocks.shape[:-2], b)]
    for i in range(1, b):
        done = torch.stack(rows, dim=-2)  # rows 0 … i−1 of the block inverse
        rows.append(eye[i] - (A_blocks[..., i:i + 1, :i] @ done).squeeze(-2))
    inv = torch.stack(rows, dim=-2)  # [..., nb, b, b]
    size = b
    while size < C:
        X, Y = inv[..., 0::2, :, :], inv[..., 1::2, :, :]
        L = torch.stack([A_CC[..., (2 * p + 1) * size:(2 * p + 2) * size, 2 * p * size:(2 * p + 1) * size]
                         for p in range(X.shape[-3])], dim=-3)
        lower = -(Y @ L @ X)
        top = torch.cat([X, torch.zeros_like(X)], dim=-1)
        bottom = torch.cat([lower, Y], dim=-1)
        inv = torch.cat([top, bottom], dim=-2)
        size *= 2
    return inv.squeeze(-3)


def unit_lower_solve(A_CC: torch.Tensor, rhs_CX: torch.Tensor) -> torch.Tensor:
    """(I + A)⁻¹ rhs for strictly lower-triangular A (batched): forward substitution in one LAPACK
    triangular solve (`torch.linalg.solve_triangular`, unit diagonal, the upper part unread), the
    same substitution `unit_lower_inverse` runs row by row in Python, without forming the inverse.
    Its backward is another triangular solve and keeps the gradient of A strictly lower. On the CPU
    this replaced ~130 small operations per chunk (forward and backward) by two.
    """
    return torch.linalg.solve_triangular(A_CC, rhs_CX, upper=False, unitriangular=True)


def chunk_kda_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunkwise KDA (chunk 64) with fla's signature; equal to `naive_recurrent_kda` up to fp32 rounding."""
    check_kda_inputs(q, k, v, g, beta, initial_state)
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    pad = (-T) % CHUNK
    # Padded tokens carry k = 0 and g = 0: they neither decay nor write the state.
    def to_chunks(x: torch.Tensor) -> torch.Tensor:  # [B, T, H, D] -> [B, H, N, C, D] fp32
        x = F.pad(x.float(), (0, 0, 0, 0, 0, pad)) if pad else x.float()
        return x.view(B, -1, CHUNK, H, x.shape[-1]).permute(0, 3, 1, 2, 4).contiguous()

    q_c, k_c, v_c, g_c = to_chunks(q), to_chunks(k), to_chunks(v), to_chunks(g)
    beta_c = (F.pad(beta.float(), (0, 0, 0, pad)) if pad else beta.float()).view(B, -1, CHUNK, H).permute(0, 3, 1, 2)  # [B,H,N,C]
    N = q_c.shape[2]

    G = g_c.cumsum(dim=3)  # chunk-local cumulative log decay, [B,H,N,C,K]
    block = _reference_block(G)
    if block is not None:
        A_qk, A_kk = _row_referenced_scores(q_c, k_c, G, beta_c, scale, block)
    else:
        A_kk = beta_c.unsqueeze(-1) * _pairwise_decayed_scores(k_c, k_c, G, include_diagonal=False)
        A_qk = scale * _pairwise_decayed_scores(q_c, k_c, G, include_diagonal=True)
    # A state forms only across chunks, from an initial state, or when the final one is asked for;
    # otherwise (T ≤ 64 in training) W = T(β ⊙ e^G ⊙ K) and the state terms are never read, and the
    # UT solve runs on β ⊙ V alone (half its columns).
    state_forms = N > 1 or initial_state is not None or output_final_state
    if state_forms:
        exp_G = G.exp()
        rhs = torch.cat([beta_c.unsqueeze(-1) * exp_G * k_c, beta_c.unsqueeze(-1) * v_c], dim=-1)
        W, U = unit_lower_solve(A_kk, rhs).split([K, V], dim=-1)  # split: its backward is one cat
        G_last = G[..., -1:, :]  # [B,H,N,1,K]
        k_to_end = k_c * (G_last - G).exp()  # K ⊙ exp(G_C − G)
        q_decayed = scale * q_c * exp_G
    else:
        U = unit_lower_solve(A_kk, beta_c.unsqueeze(-1) * v_c)

    # None stands for the zero state: with no initial state the first chunk's W S and (Q ⊙ e^G) S
    # vanish and are skipped, as is the state after the last chunk when nobody asked for it (at
    # T ≤ 64 that leaves A_qk U alone).
    # Per-chunk views by unbind, not indexing: an index's backward writes into a zero tensor of
    # the whole [B, H, N, ...] input once per chunk (N² work at T = 512); unbind's stacks them.
    U_n, A_qk_n = U.unbind(2), A_qk.unbind(2)
    if state_forms:
        W_n, q_decayed_n, k_to_end_n = W.unbind(2), q_decayed.unbind(2), k_to_end.unbind(2)
        decay_end_n = G_last.exp().transpose(-1, -2).unbind(2)  # [B,H,K,1] each
    S_BHKV = None if initial_state is None else initial_state.float()
    outputs = []
    for n in range(N):
        if S_BHKV is None:
            v_new = U_n[n]  # [B,H,C,V]
            outputs.append(A_qk_n[n] @ v_new)
        else:
            v_new = U_n[n] - W_n[n] @ S_BHKV
            outputs.append(q_decayed_n[n] @ S_BHKV + A_qk_n[n] @ v_new)
        if n + 1 < N or output_final_state:
            written = k_to_end_n[n].transpose(-1, -2) @ v_new
            S_BHKV = written if S_BHKV is None else decay_end_n[n] * S_BHKV + written
    o = torch.stack(outputs, dim=2).reshape(B, H, N * CHUNK, V)[:, :, :T]
    return o.permute(0, 2, 1, 3).to(q.dtype), (S_BHKV if output_final_state else None)
