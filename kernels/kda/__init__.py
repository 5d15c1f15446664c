"""Kimi Delta Attention (KDA) kernels with fla's public signature (DESIGN.md §8).

`chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False)
-> (o, final_state)`: `[B, T, H, K]` layout, `g` the per-token log decay, `beta` `[B, T, H]`,
states `[B, H, K, V]` in fp32, scale 1/√K by default. `naive_recurrent_kda` is the reference.
"""

from kernels.kda.chunk_torch import chunk_kda_torch
from kernels.kda.naive import kda_decode_step, naive_recurrent_kda


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False):
    """Chunkwise KDA; the torch chunked path on the CPU."""
    return chunk_kda_torch(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                           output_final_state=output_final_state)


__all__ = ["chunk_kda", "chunk_kda_torch", "naive_recurrent_kda", "kda_decode_step"]
