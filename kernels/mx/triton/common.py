"""Shared pieces of the Triton MX kernels: decoding, the split-K reduction, host helpers.

    y[m, n] = sum_k x'[m, k] * W[n, k] (+ bias[n]),   W[n, k] = P[n, k] * 2^(E[n, k // 32] - 127)

W is an MXTensor in fp4_e2m1 [N, K] (blocks of 32 along K, two codes per byte, low nibble first),
read by the kernels as int32 words of 8 codes. Decoding (_e2m1_words_to_f32): an E2M1 code c read as
fp16 bits (c & 7) << 9 | (c & 8) << 12 is exactly value(c) * 2^-14 (E2M1's subnormal 0.5 lands on
fp16's subnormal 2^-15); two codes are placed per 32-bit operation: for the low nibbles a of a word,
((a << 9) | (a << 12)) & 0x8E008E00 is an fp16 pair holding codes 0 and 4. The 2^14 is applied once
per output. The E8M0 scale is built from its bits: fp32 bits E << 23 is 2^(E-127); E = 0 and 0xFF
get mantissa 0x400000 (2^-127, NaN).

`CompiledLaunch` launches a kernel that the JIT compiled once through its compiled launcher,
skipping the JIT's per-call argument binding and cache lookup, most of a small launch's host time.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton import knobs


@triton.jit
def _e8m0_to_f32(e):
    """E8M0 code (int32, 0..255) -> 2^(e-127) as float32 (2^-127 subnormal for 0, NaN for 255)."""
    edge = (e == 0) | (e == 255)
    return ((e << 23) | tl.where(edge, 0x400000, 0)).to(tl.float32, bitcast=True)


@triton.jit
def _pow2(e):
    """2^e as float32 for int32 e in [-126, 127]."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _join8(t0, t1, t2, t3, t4, t5, t6, t7):
    """Nested joins: element (c1, c2, c3) of the result is t[c1 + 2*c2 + 4*c3], so the flattened
    position p = 4*c1 + 2*c2 + c3 holds t[bitreverse3(p)]."""
    return tl.join(tl.join(tl.join(t0, t1), tl.join(t2, t3)), tl.join(tl.join(t4, t5), tl.join(t6, t7)))


@triton.jit
def _fp16_pair_lo(p):
    return p.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _fp16_pair_hi(p):
    return (p >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _e2m1_words_to_f32(w):
    """int32 words [R, G, 4], each holding 8 E2M1 codes (code j of word i is element 8i + j,
    nibble j counted from the least significant), -> float32 values * 2^-14, [R, G, 32].

    Two codes are decoded per 32-bit operation: with a = the low nibbles of the 4 bytes, the
    fp16 magnitude of a code belongs at bits 9-11 and its sign at bit 15, so
        ((a << 9) | (a << 12)) & 0x8E008E00
    is an fp16 pair holding codes 0 and 4 (the two shifts never overlap inside the mask), and
    shifts of 1 and 4 give codes 2 and 6; the high nibbles give codes 1, 5 and 3, 7.
    """
    mask = -0x71FF7200  # 0x8E008E00 as an int32: sign bits 15 and 31, magnitudes at 9-11 and 25-27
    a = w & 0x0F0F0F0F
    b = (w >> 4) & 0x0F0F0F0F
    p04 = ((a << 9) | (a << 12)) & mask
    p26 = ((a << 1) | (a << 4)) & mask
    p15 = ((b << 9) | (b << 12)) & mask
    p37 = ((b << 1) | (b << 4)) & mask
    # Passed in the order of codes 0, 4, 2, 6, 1, 5, 3, 7 (bit-reversed), _join8 lays them out in order.
    v = _join8(_fp16_pair_lo(p04), _fp16_pair_hi(p04), _fp16_pair_lo(p26), _fp16_pair_hi(p26),
               _fp16_pair_lo(p15), _fp16_pair_hi(p15), _fp16_pair_lo(p37), _fp16_pair_hi(p37))
    return tl.reshape(v, [w.shape[0], w.shape[1], 32])


@triton.jit
def _splitk_reduce_kernel(p_ptr, bias_ptr, y_ptr, N, stride_ps, stride_pm, stride_ym,
                          S: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.program_id(1).to(tl.int64)
    n_ok = offs_n < N
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for s in range(0, S):
        acc += tl.load(p_ptr + s * stride_ps + m * stride_pm + offs_n, mask=n_ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + m * stride_ym + offs_n, acc.to(y_ptr.dtype.element_ty), mask=n_ok)


def _split_plan(kb: int, groups: int, split_k: int) -> tuple[int, int]:
    """Blocks of K per split (a multiple of `groups`) and the number of splits actually used."""
    per = -(-kb // max(1, split_k))
    per = -(-per // groups) * groups
    return per, -(-kb // per)


@functools.lru_cache(maxsize=None)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 8  # the interpreter: any small number
    return _num_sms(device.index if device.index is not None else torch.cuda.current_device())


def _splits_for(n_tiles: int, k: int, groups: int, per_sm: int, sms: int) -> int:
    """Split K so that at most about per_sm programs land on each SM."""
    return max(1, min(-(-k // 32) // groups, (per_sm * sms) // n_tiles))


def _reduce_splits(partial: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    s, m, n = partial.shape
    block = 256
    _splitk_reduce_kernel[(triton.cdiv(n, block), m)](
        partial, bias if bias is not None else partial, out, n,
        partial.stride(0), partial.stride(1), out.stride(0),
        S=s, HAS_BIAS=bias is not None, BLOCK_N=block,
    )


def _check_operands(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, k: int, out: torch.Tensor) -> None:
    assert x.dim() == 2 and x.shape[1] == k and x.stride(1) == 1 and x.dtype == torch.bfloat16
    assert codes.dtype == torch.uint8 and codes.stride(1) == 1 and scales.stride(1) == 1
    assert out.shape == (x.shape[0], codes.shape[0]) and out.stride(1) == 1


def _words(codes: torch.Tensor) -> torch.Tensor:
    """Packed fp4 codes [..., N, Kp/2] bytes -> int32 words [..., N, Kp/8] (Kp is a multiple of 32)."""
    assert codes.shape[-1] % 4 == 0 and codes.stride(-1) == 1
    assert all(st % 4 == 0 for st in codes.stride()[:-1])
    return codes.view(torch.int32)


class CompiledLaunch:
    """A kernel compiled by its first JIT launch, launched again through the compiled launcher.

    Valid only for later launches whose arguments specialise as the first one's did (the same
    int values where the JIT specialises ints, pointers with the same 16-byte alignment): callers
    key their caches on everything that decides that. Arguments go in signature order, constexprs
    included (the launcher skips them); pointers may be passed as ints. Launch hooks (a profiler's)
    are called as the JIT would call them."""

    __slots__ = ("_grid", "_compiled", "_run", "_function", "_packed")

    def __init__(self, jit_fn, grid, args, meta):
        compiled = jit_fn[grid](*args, **meta)
        compiled._init_handles()
        self._grid, self._compiled = grid, compiled
        self._run, self._function, self._packed = compiled.run, compiled.function, compiled.packed_metadata

    def __call__(self, stream: int, args) -> None:
        g = self._grid
        enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
        # Triton 3.6's hooks are HookChains, empty unless a profiler registered one.
        if (enter is None or not getattr(enter, "calls", True)) and (leave is None or not getattr(leave, "calls", True)):
            self._run(g[0], g[1], g[2], stream, self._function, self._packed, None, None, None, *args)
        else:
            meta = self._compiled.launch_metadata(g, stream, *args)
            self._run(g[0], g[1], g[2], stream, self._function, self._packed, meta, enter, leave, *args)
