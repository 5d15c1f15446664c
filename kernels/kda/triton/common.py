"""Shared pieces of the Triton KDA kernels: constants, row loads and stores, the anchored pair
regions, the program prologue, and `TileConfig` (the launch shapes, passed to every host function).

The mathematics and the stage order are in `kernels/kda/chunk_triton.py`'s docstring.
"""

from __future__ import annotations

import dataclasses

import triton
import triton.language as tl

CHUNK = 64
# Diagonal 16-blocks: row factors 2^(G_r − G_p + SHIFT) ≤ 2^SHIFT, column factors
# 2^(G_p − SHIFT − G_j) ≥ 2^−SHIFT. Exponents are clamped at EXP2_CLAMP so that no kept product
# overflows to inf (inf · 0 would be NaN).
DIAG_SHIFT = 64.0
EXP2_CLAMP = 100.0
MAX_K = 128
MAX_V = 256


@dataclasses.dataclass(frozen=True)
class TileConfig:
    """Launch shapes of the Triton KDA kernels; `TileConfig()` is the fastest correct set of the H200
    sweeps (docs/log/kda.md, which also holds the variants timed and removed). Every host function
    takes one explicitly; None means `TileConfig()`."""

    prep_key_slice: int = 32
    prep_pairs_warps: int = 4
    prep_solve_warps: int = 4
    state_warps: int = 8
    state_stages: int = 2
    state_block_v: int = 0  # 0: 64 when batch·heads ≥ 64, else 32 (more programs for the serial loop)
    bwd_key_slice: int = 32
    # 8 warps with 32-wide value blocks miscompiled a fused backward kernel (H200, Triton 3.6).
    bwd_block_v: int = 64
    bwd_values_warps: int = 4
    bwd_pairs_warps: int = 8

    def __post_init__(self):
        warps = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name.endswith("_warps")}
        bad = {n: w for n, w in warps.items() if w not in (1, 2, 4, 8, 16)}
        if bad:
            raise ValueError(f"warp counts must be 1, 2, 4, 8 or 16, got {bad}")
        slices = {n: getattr(self, n) for n in ("prep_key_slice", "bwd_key_slice")}
        bad = {n: s for n, s in slices.items() if s not in (16, 32, 64, 128)}
        if bad:
            raise ValueError(f"key slices must be 16, 32, 64 or 128, got {bad}")


def pow2_tile(n: int, cap: int) -> int:
    return min(cap, max(16, triton.next_power_of_2(n)))


@triton.jit
def _chunk_program(T, H: tl.constexpr):
    """The prologue of the chunk-parallel kernels (grid (NT, B·H)): the chunk's first row t0, the flat
    token-head index bt of (b, t = 0, h) that offsets every [B, T, H, ·] pointer, and the flat index
    of (b, chunk, h) for the per-chunk [B, NT, H, ·] buffers."""
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    NT = (T + 63) // 64
    bt = i_b.to(tl.int64) * T * H + i_h
    i_chunk = ((i_b * NT + i_t) * H + i_h).to(tl.int64)
    return i_t * 64, bt, i_chunk


@triton.jit
def _load_rows(ptr, t_start, T, stride, o_c, m_c, NR: tl.constexpr):
    """Rows t_start … t_start+NR−1 of a [T, ·] view with row stride `stride`; zeros past T."""
    o_t = t_start + tl.arange(0, NR)
    m = (o_t < T)[:, None] & m_c[None, :]
    return tl.load(ptr + o_t[:, None] * stride + o_c[None, :], mask=m, other=0.0)


@triton.jit
def _store_rows(ptr, val, t_start, T, stride, o_c, m_c, NR: tl.constexpr):
    o_t = t_start + tl.arange(0, NR)
    m = (o_t < T)[:, None] & m_c[None, :]
    tl.store(ptr + o_t[:, None] * stride + o_c[None, :], val.to(ptr.dtype.element_ty), mask=m)


@triton.jit
def _anchor_rows(Gs, t0, T, sk, o_k, m_k):
    """G at rows 0, 16, 32, 48 and 63 of the chunk (clamped to the last valid row), each [BKS]."""
    p0 = tl.load(Gs + t0 * sk + o_k, mask=m_k, other=0.0)
    p16 = tl.load(Gs + tl.minimum(t0 + 16, T - 1) * sk + o_k, mask=m_k, other=0.0)
    p32 = tl.load(Gs + tl.minimum(t0 + 32, T - 1) * sk + o_k, mask=m_k, other=0.0)
    p48 = tl.load(Gs + tl.minimum(t0 + 48, T - 1) * sk + o_k, mask=m_k, other=0.0)
    p63 = tl.load(Gs + tl.minimum(t0 + 63, T - 1) * sk + o_k, mask=m_k, other=0.0)
    return p0, p16, p32, p48, p63


@triton.jit
def _anchor(p0, p16, p32, p48, REGION: tl.constexpr):
    """Per-position anchor [64, BKS] of a pair region: 0 diagonal 16-blocks (the block's first row),
    1 blocks (1, 0) and (3, 2) (rows 16 and 48), 2 rows 32–63 × columns 0–31 (row 32)."""
    rb = (tl.arange(0, 64) // 16)[:, None]
    if REGION == 0:
        return tl.where(rb == 0, p0[None, :], tl.where(rb == 1, p16[None, :],
                        tl.where(rb == 2, p32[None, :], p48[None, :])))
    elif REGION == 1:
        return tl.where(rb < 2, p16[None, :], p48[None, :])
    else:
        return tl.where(rb < 64, p32[None, :], 0.0)


@triton.jit
def _region_mask(REGION: tl.constexpr):
    c = tl.arange(0, 64) // 16
    rb = c[:, None]
    jb = c[None, :]
    if REGION == 0:
        return rb == jb
    elif REGION == 1:
        return ((rb % 2) == 1) & (jb == rb - 1)
    else:
        return (rb >= 2) & (jb < 2)
