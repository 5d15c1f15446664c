"""The K3 model assembled (DESIGN.md §4; research/recipe.md §0).

    x₀ = Embed(ids), with <|image|> slot positions replaced by vision-encoder tokens
    for each layer ℓ:  (3 KDA : 1 gated MLA; the last layer is MLA too; the first FFN is dense)
        h = AttnRes_ℓ,attn(sources);   out = Mixer_ℓ(RMSNorm(h));   partial += out
        h = AttnRes_ℓ,ffn(sources);    out = FFN_ℓ(RMSNorm(h));     partial += out
        every `attn_res_block` layers the partial block sum joins the sources
    logits = LMHead(RMSNorm(AttnRes_final(sources)))
    loss   = CE(logits) + λ · mean_k CE(MTP_k)

There is no positional encoding anywhere in the language model. Inference carries a `ModelCache`
(k3model/cache.py: KDA conv + recurrent states, the MLA latents), updated by each forward and
returned in `ModelOutput.cache`; prefill then one-token steps equal one full forward.
Legend: B batch, T tokens, D width, V vocabulary, N images.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

from k3model.attn_res import AttnRes, BlockResidualStream
from k3model.cache import ModelCache
from k3model.common import RMSNorm
from k3model.config import ModelConfig
from k3model.kda_layer import KDALayer
from k3model.mla import GatedMLA
from k3model.moe import DenseFFN, LatentMoE
from k3model.vision import VisionEncoder

IGNORE_INDEX = -100


@dataclass
class ModelOutput:
    logits_BTV: torch.Tensor | None
    hidden_BTD: torch.Tensor  # the final hidden state before the output norm (feeds MTP)
    cache: ModelCache | None


class Block(nn.Module):
    """One layer: a token mixer (KDA or gated MLA) and an FFN (dense or LatentMoE), each fed by AttnRes."""

    def __init__(self, cfg: ModelConfig, mixer: str, ffn: str):
        super().__init__()
        d = cfg.d_model
        self.mixer_kind = mixer
        self.mixer_res, self.mixer_norm = AttnRes(d, cfg.norm_eps), RMSNorm(d, cfg.norm_eps)
        self.mixer = KDALayer(cfg.kda()) if mixer == "kda" else GatedMLA(cfg.mla())
        self.ffn_res, self.ffn_norm = AttnRes(d, cfg.norm_eps), RMSNorm(d, cfg.norm_eps)
        self.ffn = DenseFFN(d, cfg.dense_hidden) if ffn == "dense" else LatentMoE(cfg.moe())
        self.activation_checkpointing = cfg.activation_checkpointing

    def forward(self, stream: BlockResidualStream, layer_cache=None, use_cache: bool = False):
        if self.activation_checkpointing and self.training and not use_cache and torch.is_grad_enabled():
            stream.add(self._recomputed(self._mix, stream.sources()))
            stream.add(self._recomputed(self._feed_forward, stream.sources()))
            return None
        h = self.mixer_res(stream.sources())
        out, new_cache = self.mixer(self.mixer_norm(h), layer_cache if use_cache else None)
        stream.add(out)
        h = self.ffn_res(stream.sources())
        stream.add(self.ffn(self.ffn_norm(h)))
        return new_cache if use_cache else None

    def _mix(self, *sources: torch.Tensor) -> torch.Tensor:
        return self.mixer(self.mixer_norm(self.mixer_res(list(sources))), None)[0]

    def _feed_forward(self, *sources: torch.Tensor) -> torch.Tensor:
        return self.ffn(self.ffn_norm(self.ffn_res(list(sources))))

    def _recomputed(self, part, sources: list[torch.Tensor]) -> torch.Tensor:
        """part(*sources), keeping only its inputs for the backward, which runs it again; the MoE
        observes its routing (balancing statistics) on the first run only."""
        calls = 0

        def run(*xs):
            nonlocal calls
            if isinstance(self.ffn, LatentMoE):
                self.ffn.observing = calls == 0
            calls += 1
            try:
                return part(*xs)
            finally:
                if isinstance(self.ffn, LatentMoE):
                    self.ffn.observing = True

        # The block draws no random numbers, so there is no RNG state to stash and replay (stashing
        # it would also fail for a CPU model compiled on a machine with CUDA: Dynamo initializes
        # CUDA inside the checkpointed forward).
        return torch.utils.checkpoint.checkpoint(run, *sources, use_reentrant=False, preserve_rng_state=False)


class MTPModule(nn.Module):
    """DeepSeek-V3-style multi-token prediction, depth k: from the previous depth's hidden state at
    position i and the embedding of token i+k, predict token i+k+1 (shared embedding and head)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.hidden_norm, self.embed_norm = RMSNorm(d, cfg.norm_eps), RMSNorm(d, cfg.norm_eps)
        self.merge = nn.Linear(2 * d, d, bias=False)
        self.block = Block(cfg, mixer="mla", ffn="dense")
        self.out_res = AttnRes(d, cfg.norm_eps)

    def forward(self, hidden_BTD: torch.Tensor, next_embed_BTD: torch.Tensor) -> torch.Tensor:
        x = self.merge(torch.cat([self.hidden_norm(hidden_BTD), self.embed_norm(next_embed_BTD)], dim=-1))
        stream = BlockResidualStream(x)
        self.block(stream)
        return self.out_res(stream.sources())


class K3Model(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(
            Block(cfg, mixer="mla" if cfg.is_mla_layer(i) else "kda",
                  ffn="dense" if cfg.is_dense_layer(i) else "moe")
            for i in range(cfg.n_layers)
        )
        self.final_res = AttnRes(cfg.d_model, cfg.norm_eps)
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.mtp = nn.ModuleList(MTPModule(cfg) for _ in range(cfg.mtp_depth))
        self.vision = VisionEncoder(cfg.vision, cfg.d_model) if cfg.vision is not None else None
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)) and module.weight.device.type != "meta":
            nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def moe_layers(self) -> list[LatentMoE]:
        return [m for m in self.modules() if isinstance(m, LatentMoE)]

    def embed_inputs(self, input_ids_BT, images_NCHW=None, image_mask_BT=None) -> torch.Tensor:
        x_BTD = self.embed(input_ids_BT)
        if images_NCHW is None:
            return x_BTD
        if self.vision is None:
            raise ValueError("this model has no vision encoder (cfg.vision is None); drop the images")
        if image_mask_BT is None:
            raise ValueError("images given without image_mask_BT (True where <|image|> slot tokens sit)")
        tokens_NPD = self.vision(images_NCHW)
        n_slots = int(image_mask_BT.sum())
        if n_slots != tokens_NPD.shape[0] * tokens_NPD.shape[1]:
            raise ValueError(
                f"{n_slots} <|image|> slot tokens but {tokens_NPD.shape[0]} images × "
                f"{tokens_NPD.shape[1]} tokens each; put {self.cfg.vision.tokens_per_image} <|image|> slots per image"
            )
        x_BTD = x_BTD.masked_scatter(image_mask_BT.unsqueeze(-1), tokens_NPD.reshape(-1, x_BTD.shape[-1]).to(x_BTD.dtype))
        return x_BTD

    def forward(self, input_ids_BT, images_NCHW=None, image_mask_BT=None, cache: ModelCache | None = None,
                use_cache: bool = False, logits: bool = True) -> ModelOutput:
        """`logits=False` skips the output head (logits_BTV is None): a prefill needs only the last
        position's, which the caller computes from `hidden_BTD`."""
        if input_ids_BT.dim() != 2:
            raise ValueError(f"input_ids must be [B, T], got shape {tuple(input_ids_BT.shape)}")
        use_cache = use_cache or cache is not None
        B, T = input_ids_BT.shape
        if cache is not None:
            cache.check(self, B)
        x_BTD = self.embed_inputs(input_ids_BT, images_NCHW, image_mask_BT)
        if use_cache and cache is None:
            cache = ModelCache.empty(self, B, capacity=T, device=x_BTD.device, dtype=x_BTD.dtype)
        stream = BlockResidualStream(x_BTD)
        for i, layer in enumerate(self.layers):
            new_layer_cache = layer(stream, cache.layers[i] if use_cache else None, use_cache)
            if use_cache:
                cache.set_layer(i, new_layer_cache)
            if (i + 1) % self.cfg.attn_res_block == 0:
                stream.close_block()
        hidden_BTD = self.final_res(stream.sources())
        logits_BTV = self.lm_head(self.final_norm(hidden_BTD)) if logits else None
        if use_cache:
            cache.advance(T)
        new_cache = cache if use_cache else None
        return ModelOutput(logits_BTV, hidden_BTD, new_cache)

    def compute_loss(self, input_ids_BT, labels_BT=None, images_NCHW=None, image_mask_BT=None,
                     answer_mask_BT=None) -> dict:
        """Next-token CE (+ λ·MTP). labels_BT[t] is the target at position t (IGNORE_INDEX skips);
        by default the next input token, with image positions and the last position ignored.

        `answer_mask_BT` (bool, True where labels_BT[t] is a clue answer's token) makes the main loss
        the mean over those targets plus the mean over the rest: a clue row's ~10 answer targets
        would otherwise weigh ~1 % of a mixed batch, too little for the tiny model to learn the task
        (docs/log/tiny.md).
        """
        if labels_BT is None:
            labels_BT = default_labels(input_ids_BT, image_mask_BT)
        out = self.forward(input_ids_BT, images_NCHW, image_mask_BT)
        V = self.cfg.vocab_size
        logits_NV, labels_N = out.logits_BTV.float().reshape(-1, V), labels_BT.reshape(-1)
        if answer_mask_BT is None:
            main = F.cross_entropy(logits_NV, labels_N, ignore_index=IGNORE_INDEX)
            losses = {"loss/main": main}
        else:
            nll_N = F.cross_entropy(logits_NV, labels_N, ignore_index=IGNORE_INDEX, reduction="none")
            valid_N = labels_N != IGNORE_INDEX
            answer_N = answer_mask_BT.reshape(-1) & valid_N
            rest_N = valid_N & ~answer_N
            # Each group's mean (0 when the batch has none of it).
            answer = (nll_N * answer_N).sum() / answer_N.sum().clamp(min=1)
            rest = (nll_N * rest_N).sum() / rest_N.sum().clamp(min=1)
            main = answer + rest
            losses = {"loss/main": main, "loss/answer": answer, "loss/rest": rest}
        total = main
        if len(self.mtp):
            hidden, mtp_losses = out.hidden_BTD, []
            for k, module in enumerate(self.mtp, start=1):
                if input_ids_BT.shape[1] <= k:
                    break
                next_embed = self.embed(input_ids_BT[:, k:])
                hidden = module(hidden[:, :-1], next_embed)
                logits = self.lm_head(self.final_norm(hidden)).float()
                target = labels_BT[:, k:]
                mtp_losses.append(F.cross_entropy(logits.reshape(-1, V), target.reshape(-1), ignore_index=IGNORE_INDEX))
                losses[f"loss/mtp_{k}"] = mtp_losses[-1]
            if mtp_losses:
                total = total + self.cfg.mtp_loss_weight * torch.stack(mtp_losses).mean()
        losses["loss/total"] = total
        return losses


def default_labels(input_ids_BT: torch.Tensor, image_mask_BT: torch.Tensor | None = None) -> torch.Tensor:
    labels = torch.full_like(input_ids_BT, IGNORE_INDEX)
    labels[:, :-1] = input_ids_BT[:, 1:]
    if image_mask_BT is not None:
        # Never train the model to predict <|image|> slots.
        labels[:, :-1] = labels[:, :-1].masked_fill(image_mask_BT[:, 1:], IGNORE_INDEX)
    return labels
