"""The inference cache of a K3 model: what a decode step needs from the past, typed per layer.

    KDA layer  → KDAState: three short-conv windows [B, H·K, W−1] (the last W−1 projected inputs)
                 and the recurrent matrix [B, H, K, V] in fp32 — O(1) in the sequence length
    MLA layer  → LatentCache: a buffer [B, capacity, kv_rank + rope] holding, per cached token,
                 ĉ = RMSNorm(c_kv) and the shared key part k_r (the only per-token state MLA has)

Rows of a batch may hold different lengths (`lengths`, one int per row). With no positional
encoding anywhere in the model, a row's length matters only to MLA, which attends to that row's
first `length` buffer entries; nothing is ever left-padded (see k3model/engine.py for why).

    cache = ModelCache.empty(model, batch=1, capacity=T + new)   # or model(ids, use_cache=True).cache
    model(prompt_1T, cache=cache)             # prefill once
    group = cache.fork(8)                     # 8 rows sharing the prompt's state (RL groups)
    cache.rollback(length)                    # the state after an earlier position (speculative decoding)

Rollback keeps a state per position rather than snapshotting and replaying. A KDA state cannot be
truncated like a KV cache: it is a sum over all past tokens. Replaying the accepted tokens would run
the target model a second time over most of every accepted draft, and a state per position is cheap
here: decode steps build new state tensors rather than mutating old ones, so recording a position
stores references, not copies. A multi-token forward into a recording cache (a speculative verify)
runs KDA's recurrence over its tokens in one C call on the CPU and keeps what rebuilds the state
after any of them (kda_layer.VerifyPositions: the recurrence replayed over the kept tokens, built
only when a rollback asks for that position); elsewhere it runs the recurrence token by token and
keeps each position's state. The conv windows are per-position states too and are restored with
the recurrent matrix. MLA needs nothing: entries
past the new length are masked out and overwritten by the next write.
`ModelCache.empty(..., max_rollback=n)` keeps the last n positions; 0 (the default) records nothing.

`static=True` is the CUDA-graph layout: fixed capacity, lengths in a device tensor, every update in
place (so a captured step can be replayed), MLA attending to the whole buffer under a length mask.
`to_static(capacity, max_tokens=n)` also lets one forward feed up to n tokens (a speculative verify)
and keeps, in fixed buffers, each KDA layer's state after every one of them; `keep(kept, fed)` then
makes the state after the first `kept` tokens the live one with `kept` a device tensor, so a whole
speculative round can be captured with no host synchronisation (k3model/speculative.py).
Legend: B batch rows, S capacity, L latent entry width, N the most tokens one static forward feeds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial

import torch

from k3model.kda_layer import KDAState


@dataclass
class LatentCache:
    """One MLA layer's cached latents; `owner` holds the per-row lengths shared by all layers."""
    buffer_BSL: torch.Tensor
    owner: "ModelCache" = field(repr=False)

    def write(self, entry_BTL: torch.Tensor) -> None:
        """Store T new entries per row right after that row's current length."""
        B, T, _ = entry_BTL.shape
        owner = self.owner
        if owner.static:
            if T > owner.max_tokens:
                raise ValueError(f"this static (CUDA-graph) cache takes at most {owner.max_tokens} token(s) a "
                                 "forward; prefill into a dynamic cache and convert it with "
                                 ".to_static(capacity, max_tokens=n)")
            # No bounds check here (it would synchronise with the host): the caller sizes `capacity`.
            rows_B1 = torch.arange(B, device=entry_BTL.device).unsqueeze(1)
            pos_BT = owner.lengths_B.unsqueeze(1) + torch.arange(T, device=entry_BTL.device)
            self.buffer_BSL.index_put_((rows_B1, pos_BT), entry_BTL.to(self.buffer_BSL.dtype))
            return
        lengths = owner.lengths
        needed = max(lengths) + T
        if needed > self.buffer_BSL.shape[1]:
            grown = self.buffer_BSL.new_zeros(B, max(needed, 2 * self.buffer_BSL.shape[1]), self.buffer_BSL.shape[2])
            grown[:, : self.buffer_BSL.shape[1]] = self.buffer_BSL
            self.buffer_BSL = grown
        if min(lengths) == max(lengths):
            self.buffer_BSL[:, lengths[0]: lengths[0] + T] = entry_BTL.to(self.buffer_BSL.dtype)
        elif T == 1:
            rows_B = torch.arange(B, device=entry_BTL.device)
            pos_B = torch.tensor(lengths, device=entry_BTL.device)
            self.buffer_BSL[rows_B, pos_B] = entry_BTL[:, 0].to(self.buffer_BSL.dtype)
        else:
            raise ValueError(
                f"rows hold different lengths ({sorted(set(lengths))}); feed them one token each, or "
                "extend them one row at a time (cache.select([i]))"
            )


def _position_state(positions, t: int) -> KDAState:
    """The state after token t of a multi-token forward, from its layer's `positions`."""
    if isinstance(positions, list):
        return replace(positions[t], positions=None, keep_positions=False)
    return positions.state(t)


class ModelCache:
    """Per-layer inference state of a K3Model for `batch` rows; see the module docstring."""

    def __init__(self, layers: list, lengths: list[int], model_id: int, static: bool = False,
                 max_rollback: int = 0):
        self.layers = layers
        self.lengths = list(lengths)
        self.model_id = model_id
        self.static = static
        self.max_rollback = max_rollback
        self.lengths_B: torch.Tensor | None = None  # device copy of `lengths`, static caches only
        self.max_tokens = 1  # tokens one forward may feed a static cache (to_static's max_tokens)
        # Static caches fed several tokens a forward: per KDA layer (conv_q, conv_k, conv_v,
        # recurrent) stacked over the forward's tokens [N, …], the state after each token.
        self._static_positions: dict[int, tuple[torch.Tensor, ...]] = {}
        self._history: dict[int, list] = {}
        for layer in self.layers:
            if isinstance(layer, LatentCache):
                layer.owner = self
        if max_rollback:
            if static:
                raise ValueError("a static (CUDA-graph) cache keeps no rollback history; use max_rollback=0")
            self._record_history()

    # --- construction --------------------------------------------------------------------------
    @classmethod
    def empty(cls, model, batch: int, capacity: int, device=None, dtype=None, max_rollback: int = 0,
              static: bool = False) -> "ModelCache":
        """A cache of `batch` empty rows for `model`, MLA buffers sized for `capacity` tokens (dynamic
        caches grow when a write goes past it)."""
        if batch < 1:
            raise ValueError(f"batch must be ≥ 1, got {batch}")
        param = next(model.parameters())
        device = param.device if device is None else device
        dtype = param.dtype if dtype is None else dtype
        layers = []
        for layer in model.layers:
            if layer.mixer_kind == "kda":
                layers.append(layer.mixer.empty_state(batch, device, dtype))
            else:
                cfg = layer.mixer.cfg
                buffer = torch.zeros(batch, max(capacity, 1), cfg.kv_rank + cfg.qk_rope_dim, device=device, dtype=dtype)
                layers.append(LatentCache(buffer, None))
        cache = cls(layers, [0] * batch, id(model), max_rollback=max_rollback)
        return cache.to_static(capacity) if static else cache

    def _rebuild(self, layers: list, lengths: list[int], max_rollback: int | None = None) -> "ModelCache":
        return ModelCache(layers, lengths, self.model_id, max_rollback=self.max_rollback if max_rollback is None else max_rollback)

    # --- properties ----------------------------------------------------------------------------
    @property
    def batch(self) -> int:
        return len(self.lengths)

    @property
    def length(self) -> int:
        """The longest row's length (every row's, when they are equal)."""
        return max(self.lengths)

    @property
    def capacity(self) -> int:
        return min((layer.buffer_BSL.shape[1] for layer in self.layers if isinstance(layer, LatentCache)),
                   default=0)

    def check(self, model, batch: int) -> None:
        """ValueError unless this cache was made for `model` with `batch` rows."""
        if self.model_id != id(model):
            raise ValueError("this cache was built for another model; make one for this model "
                             "(ModelCache.empty(model, ...) or model(ids, use_cache=True).cache)")
        if batch != self.batch:
            raise ValueError(f"the cache holds {self.batch} rows but the input has {batch}; "
                             f"use cache.fork(n) or cache.select(rows) to match")

    # --- what the model's forward calls ---------------------------------------------------------
    def set_layer(self, i: int, state) -> None:
        """Take layer i's new state (KDA layers return a new KDAState; MLA layers wrote in place)."""
        if not isinstance(state, KDAState):
            return
        if self.static:
            old = self.layers[i]
            if state.positions is not None and i in self._static_positions:
                # A multi-token forward: the state after each of its tokens, the last one included
                # (built before the live state is overwritten: VerifyPositions reads it).
                steps = [_position_state(state.positions, t) for t in range(len(state.positions))] + [state]
                for name, stacked in zip(("conv_q", "conv_k", "conv_v", "recurrent"), self._static_positions[i]):
                    torch.stack([getattr(p, name) for p in steps], out=stacked[: len(steps)])
            for name in ("conv_q", "conv_k", "conv_v", "recurrent"):
                getattr(old, name).copy_(getattr(state, name))
            return
        self.layers[i] = state

    def advance(self, n_tokens: int) -> None:
        """Every row grew by n_tokens (called once per forward, after all layers)."""
        if self.static:
            self.lengths_B += n_tokens
            self.lengths = [n + n_tokens for n in self.lengths]
            return
        start = self.lengths[0]
        self.lengths = [n + n_tokens for n in self.lengths]
        if self.max_rollback:
            if len(set(self.lengths)) != 1:
                raise ValueError("rollback history needs rows of equal length; use max_rollback=0")
            # Intermediate positions of a multi-token forward, from the layers' per-position states.
            # (built when a rollback asks for one: most rounds of a speculative decode roll back once or not at all).
            recorded = all(layer.positions is not None for layer in self.layers if isinstance(layer, KDAState))
            for t in range(n_tokens - 1 if recorded else 0):
                self._history[start + 1 + t] = [
                    partial(_position_state, layer.positions, t) if isinstance(layer, KDAState) else None
                    for layer in self.layers]
            self._record_history()
            for key in [k for k in self._history if k < self.lengths[0] - self.max_rollback]:
                del self._history[key]

    def _record_history(self) -> None:
        self._history[self.lengths[0]] = [
            replace(layer, positions=None, keep_positions=False) if isinstance(layer, KDAState) else None
            for layer in self.layers]
        if self.lengths[0] == 0:
            return  # a prefill runs chunked: rolling back into the prompt is not offered
        # Ask the KDA layers for per-position states on the next multi-token forward.
        for i, layer in enumerate(self.layers):
            if isinstance(layer, KDAState):
                self.layers[i] = replace(layer, positions=None, keep_positions=True)

    # --- fork, select, rollback -------------------------------------------------------------------
    def _map_rows(self, fn) -> list:
        layers = []
        for layer in self.layers:
            if isinstance(layer, KDAState):
                layers.append(KDAState(fn(layer.conv_q), fn(layer.conv_k), fn(layer.conv_v), fn(layer.recurrent)))
            else:
                layers.append(LatentCache(fn(layer.buffer_BSL), None))
        return layers

    def fork(self, n: int) -> "ModelCache":
        """n copies of every row, row i's copies at n·i … n·i + n − 1 (a prompt prefilled once, n samples).
        The copies own their tensors; rollback history is not carried over."""
        if n < 1:
            raise ValueError(f"fork needs n ≥ 1, got {n}")
        if self.static:
            raise ValueError("fork a dynamic cache, then convert it with .to_static(capacity)")
        layers = self._map_rows(lambda t: t.repeat_interleave(n, dim=0))
        return self._rebuild(layers, [length for length in self.lengths for _ in range(n)])

    def select(self, rows: list[int]) -> "ModelCache":
        """A cache of the given rows (in that order; repeats allowed)."""
        if not rows or any(not 0 <= r < self.batch for r in rows):
            raise ValueError(f"rows must be a non-empty list of indices in [0, {self.batch}), got {rows}")
        if self.static:
            raise ValueError("select rows of a dynamic cache, then convert it with .to_static(capacity)")
        device = self.layers[0].recurrent.device if isinstance(self.layers[0], KDAState) else self.layers[0].buffer_BSL.device
        index = torch.tensor(rows, device=device)
        return self._rebuild(self._map_rows(lambda t: t.index_select(0, index)), [self.lengths[r] for r in rows])

    @staticmethod
    def cat(caches: list["ModelCache"]) -> "ModelCache":
        """The rows of several caches of one model, stacked in order (MLA buffers padded to the largest)."""
        if not caches:
            raise ValueError("cat needs at least one cache")
        if len({c.model_id for c in caches}) != 1:
            raise ValueError("cat joins caches of one model; these come from different models")
        if any(c.static for c in caches):
            raise ValueError("cat dynamic caches, then convert the result with .to_static(capacity)")
        layers = []
        for i, first in enumerate(caches[0].layers):
            if isinstance(first, KDAState):
                parts = [c.layers[i] for c in caches]
                layers.append(KDAState(*(torch.cat([getattr(p, name) for p in parts])
                                         for name in ("conv_q", "conv_k", "conv_v", "recurrent"))))
            else:
                buffers = [c.layers[i].buffer_BSL for c in caches]
                S = max(b.shape[1] for b in buffers)
                layers.append(LatentCache(torch.cat([torch.nn.functional.pad(b, (0, 0, 0, S - b.shape[1]))
                                                     for b in buffers]), None))
        return ModelCache(layers, [n for c in caches for n in c.lengths], caches[0].model_id)

    def rollback(self, length: int) -> None:
        """Return every row to the state after its first `length` tokens (in place), KDA states and
        conv windows included. Possible for the last `max_rollback` positions of a recording cache."""
        if self.static or not self.max_rollback:
            raise ValueError("this cache records no history; build it with ModelCache.empty(..., max_rollback=n)")
        if length not in self._history:
            have = sorted(self._history)
            raise ValueError(f"cannot roll back to length {length}: this cache holds the states after "
                             f"lengths {have[0]}…{have[-1]} (max_rollback = {self.max_rollback})")
        states = self._history[length]
        for i, state in enumerate(states):
            if callable(state):
                state = state()
            if state is not None:
                self.layers[i] = replace(state, keep_positions=length > 0)
        self.lengths = [length] * self.batch
        for key in [k for k in self._history if k > length]:
            del self._history[key]

    def keep(self, kept: torch.Tensor, fed: int) -> None:
        """Of the last forward's `fed` tokens into this static cache, keep the first `kept` (a long
        tensor [1] on the device, 1 ≤ kept ≤ fed, one value for every row): the KDA states after
        token kept − 1 become the live ones and the lengths shrink by fed − kept. Nothing is read on
        the host, so a CUDA graph can capture it; `lengths` (the host copy) is left as it was, for
        the caller to set once it has read `kept`."""
        if not self.static or fed > self.max_tokens:
            raise ValueError(f"keep() needs a static cache fed at most max_tokens tokens a forward "
                             f"(static={self.static}, max_tokens={self.max_tokens}, fed={fed}); "
                             "build it with .to_static(capacity, max_tokens=n)")
        index_1 = (kept - 1).view(1)
        for i, stacked in self._static_positions.items():
            live = self.layers[i]
            for name, positions in zip(("conv_q", "conv_k", "conv_v", "recurrent"), stacked):
                getattr(live, name).copy_(positions.index_select(0, index_1).squeeze(0))
        self.lengths_B -= fed - kept

    def load(self, other: "ModelCache") -> None:
        """Copy a dynamic cache of the same model and batch into this static cache, in place, so the
        CUDA graphs captured over this one replay on the new contents (engine.reused)."""
        if not self.static or other.static:
            raise ValueError("load() copies a dynamic cache into a static one")
        if other.model_id != self.model_id or other.batch != self.batch:
            raise ValueError(f"load() needs a cache of the same model and batch ({self.batch} rows)")
        if other.length > self.capacity:
            raise ValueError(f"the cache holds {other.length} tokens, more than this one's capacity {self.capacity}")
        for mine, theirs in zip(self.layers, other.layers):
            if isinstance(mine, KDAState):
                for name in ("conv_q", "conv_k", "conv_v", "recurrent"):
                    getattr(mine, name).copy_(getattr(theirs, name))
            else:
                # Entries past a row's length are masked out, so what an earlier call left there stays.
                n = min(theirs.buffer_BSL.shape[1], self.capacity)
                mine.buffer_BSL[:, :n].copy_(theirs.buffer_BSL[:, :n])
        self.lengths = list(other.lengths)
        self.lengths_B.copy_(torch.tensor(other.lengths))

    def tensors(self) -> list[torch.Tensor]:
        """Every state tensor (for saving and restoring a static cache around a CUDA-graph capture)."""
        out = []
        for layer in self.layers:
            if isinstance(layer, KDAState):
                out += [layer.conv_q, layer.conv_k, layer.conv_v, layer.recurrent]
            else:
                out.append(layer.buffer_BSL)
        return out + ([self.lengths_B] if self.lengths_B is not None else [])

    def to_static(self, capacity: int, max_tokens: int = 1) -> "ModelCache":
        """The CUDA-graph layout of this cache: MLA buffers of exactly `capacity` tokens, lengths on the
        device, every later update in place. `max_tokens` > 1: a forward may feed up to that many
        tokens, and `keep` can return to the state after any of them (see the module docstring)."""
        if capacity < self.length:
            raise ValueError(f"capacity {capacity} is below the cache's length {self.length}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be ≥ 1, got {max_tokens}")
        layers, positions = [], {}
        for i, layer in enumerate(self.layers):
            if isinstance(layer, KDAState):
                tensors = [t.clone() for t in (layer.conv_q, layer.conv_k, layer.conv_v, layer.recurrent)]
                # keep_positions asks the KDA layer for each token's state on a multi-token forward.
                layers.append(KDAState(*tensors, keep_positions=max_tokens > 1))
                if max_tokens > 1:
                    positions[i] = tuple(t.new_zeros(max_tokens, *t.shape) for t in tensors)
            else:
                b = layer.buffer_BSL[:, :capacity]
                layers.append(LatentCache(torch.nn.functional.pad(b, (0, 0, 0, capacity - b.shape[1])).contiguous(), None))
        cache = ModelCache(layers, self.lengths, self.model_id, static=True)
        cache.max_tokens, cache._static_positions = max_tokens, positions
        device = layers[0].recurrent.device if isinstance(layers[0], KDAState) else layers[0].buffer_BSL.device
        cache.lengths_B = torch.tensor(self.lengths, device=device)
        return cache
