"""Model configuration: one frozen dataclass per module and the profile registry.

A profile name selects every size (DESIGN.md §3): `smoke` (the test suite), `tiny` (the default,
a 2-core CPU), `small` (one GPU) and `k3` (the published shape, used for parameter and FLOP
accounting only — never instantiated). Secondary sizes are derived in one place, `ModelConfig`.

K3 shape (torchtitan `kimi_k3` port README, citing the HF card): 93 layers, first dense; 69 KDA +
24 gated MLA (MLA at every 4th layer and at the last); hidden 7168; 896 routed experts, top-16, in a
3584-wide latent, expert hidden 3072; 2 shared experts; vocabulary ~160K; MLA q rank 1536, kv rank
512; MoonViT-V2 vision encoder ~0.4B.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable


@dataclass(frozen=True)
class KDAConfig:
    d_model: int
    n_heads: int
    head_dim: int  # K = V, the per-head state is head_dim × head_dim
    conv_kernel: int = 4
    gate_lower_bound: float = -5.0  # g = lb · sigmoid(exp(A)·(f(x) + dt_bias)) ∈ (lb, 0)
    norm_eps: float = 1e-6


@dataclass(frozen=True)
class MLAConfig:
    d_model: int
    n_heads: int
    q_rank: int | None  # None: queries straight from x (no low-rank compression)
    kv_rank: int  # width of the cached latent c_kv
    qk_nope_dim: int
    qk_rope_dim: int  # kept in the projections as in K3, but no rotation is applied (NoPE)
    v_head_dim: int
    norm_eps: float = 1e-6


@dataclass(frozen=True)
class MoEConfig:
    d_model: int
    n_routed: int
    top_k: int
    n_shared: int
    latent_dim: int  # routed experts run in this shared down-projected width
    expert_hidden: int
    shared_hidden: int  # shared experts run at full width with this hidden size
    balancing: str = "quantile"  # "quantile" | "deepseek" | "none"
    bias_update_rate: float = 1e-3  # γ of the DeepSeek fixed-step update
    # Tokens the quantile bias averages its solutions over (k3model/moe.py): 0 is K3's overwrite.
    quantile_window_tokens: int = 0
    routed_scale: float = 2.5
    situ_beta1: float = 4.0
    situ_beta2: float = 25.0
    qat: bool = False  # MXFP4 weights and MXFP8 activations on the routed experts (STE)


@dataclass(frozen=True)
class VisionConfig:
    image_size: int
    patch_size: int
    d_model: int
    n_layers: int
    n_heads: int
    mlp_hidden: int
    channels: int = 3
    merge: int = 2  # 2×2 patch merge before the projector

    @property
    def tokens_per_image(self) -> int:
        side = self.image_size // self.patch_size // self.merge
        return side * side


@dataclass(frozen=True)
class ModelConfig:
    name: str
    vocab_size: int
    d_model: int
    n_layers: int
    kda_heads: int
    kda_head_dim: int
    mla_heads: int
    mla_q_rank: int | None
    mla_kv_rank: int
    mla_qk_nope_dim: int
    mla_qk_rope_dim: int
    mla_v_head_dim: int
    mla_every: int  # every `mla_every`-th layer is gated MLA (3 KDA : 1 MLA), and the last layer too
    n_dense_layers: int
    dense_hidden: int
    n_routed: int
    top_k: int
    n_shared: int
    moe_latent_dim: int
    expert_hidden: int
    shared_hidden: int
    attn_res_block: int  # layers per attention-residual block
    mtp_depth: int
    mtp_loss_weight: float
    vision: VisionConfig | None
    balancing: str = "quantile"
    quantile_window_tokens: int = 0  # MoEConfig.quantile_window_tokens
    tie_embeddings: bool = False
    qat: bool = False
    norm_eps: float = 1e-6
    # Recompute each layer's activations in the backward instead of keeping them (training only):
    # the small profile's 65536-token step needs > 140 GB without it on one GPU.
    activation_checkpointing: bool = False

    def __post_init__(self) -> None:
        if self.n_layers < 1:
            raise ValueError(f"n_layers must be ≥ 1, got {self.n_layers}")
        if self.mla_every < 2:
            raise ValueError(f"mla_every must be ≥ 2 (3 KDA : 1 MLA is 4), got {self.mla_every}")
        if self.top_k > self.n_routed:
            raise ValueError(f"top_k ({self.top_k}) cannot exceed n_routed ({self.n_routed})")
        if self.balancing not in ("quantile", "deepseek", "none"):
            raise ValueError(f"balancing must be 'quantile', 'deepseek' or 'none', got {self.balancing!r}")
        if self.quantile_window_tokens < 0:
            raise ValueError(f"quantile_window_tokens must be ≥ 0 (0: each step's solved bias overwrites the old "
                             f"one), got {self.quantile_window_tokens}")
        if self.vision is not None and self.vision.image_size % (self.vision.patch_size * self.vision.merge):
            raise ValueError(
                f"vision.image_size ({self.vision.image_size}) must be a multiple of "
                f"patch_size × merge ({self.vision.patch_size * self.vision.merge})"
            )

    # Derived sizes live here, in one place.
    def is_mla_layer(self, i: int) -> bool:
        return (i + 1) % self.mla_every == 0 or i == self.n_layers - 1

    def is_dense_layer(self, i: int) -> bool:
        return i < self.n_dense_layers

    @property
    def n_mla_layers(self) -> int:
        return sum(self.is_mla_layer(i) for i in range(self.n_layers))

    @property
    def n_kda_layers(self) -> int:
        return self.n_layers - self.n_mla_layers

    def kda(self) -> KDAConfig:
        return KDAConfig(d_model=self.d_model, n_heads=self.kda_heads, head_dim=self.kda_head_dim,
                         norm_eps=self.norm_eps)

    def mla(self) -> MLAConfig:
        return MLAConfig(d_model=self.d_model, n_heads=self.mla_heads, q_rank=self.mla_q_rank,
                         kv_rank=self.mla_kv_rank, qk_nope_dim=self.mla_qk_nope_dim,
                         qk_rope_dim=self.mla_qk_rope_dim, v_head_dim=self.mla_v_head_dim,
                         norm_eps=self.norm_eps)

    def moe(self) -> MoEConfig:
        return MoEConfig(d_model=self.d_model, n_routed=self.n_routed, top_k=self.top_k,
                         n_shared=self.n_shared, latent_dim=self.moe_latent_dim,
                         expert_hidden=self.expert_hidden, shared_hidden=self.shared_hidden,
                         balancing=self.balancing, quantile_window_tokens=self.quantile_window_tokens,
                         qat=self.qat)


@dataclass(frozen=True)
class StageConfig:
    """One pretraining context stage: sequence length and token budget."""
    seq_len: int
    steps: int
    batch_size: int
    lr: float
    # Steps at the start of the stage whose rows are all clue rows (then the stage's usual mix). The
    # tiny model learns the clue task after a clue-only start, not in the 50 % mix alone
    # (docs/log/tiny.md; benchmarks/results/train/2026-12-01_clue_sweep_h200_3.json).
    clue_warmup_steps: int = 0
    # Peak lr of the steps after the clue warmup, which start a warmup and cosine of their own; None:
    # one schedule over the whole stage. A model trained on clue answers alone is far off on text (the
    # tiny one: still 17 nats after ten small steps), so the first mixed steps' gradients are ~30× the
    # clue phase's and point the clipped update almost wholly at the text; a fresh warmup keeps those
    # steps small (docs/log/tiny.md).
    mixed_lr: float | None = None
    # Activation checkpointing in this stage; None: the model's setting. A memory knob (the same
    # gradients), set per stage because short rows need far less activation memory than long ones.
    activation_checkpointing: bool | None = None
    # With activation_checkpointing False: the GPU memory (GiB) the stage needs without it; on a
    # smaller GPU the stage keeps checkpointing (same gradients, slower) and says so. None: no bound.
    checkpointing_off_gib: float | None = None
    # MoEConfig.quantile_window_tokens in this stage; None: the model's. Per stage because a router
    # trained from random weights drifts faster than a window can follow (docs/log/pretrain.md 2026-12-06).
    quantile_window_tokens: int | None = None


@dataclass(frozen=True)
class Profile:
    name: str
    model: ModelConfig
    stages: tuple[StageConfig, ...] = field(default_factory=tuple)
    device: str = "cpu"
    # The pretraining optimizer by default ("muon" | "adamw"; a stage's `optimizer` overrides it): each
    # profile's is the winner of its own stage-1 A/B at equal tokens (benchmarks/recipes/muon_ab.py,
    # docs/log/pretrain.md): Muon on tiny (CPU, 150 steps), AdamW on small (H100, 40 steps).
    optimizer: str = "muon"


# ----------------------------------------------------------------------------------------------
# The registry: one small function per named preset.

def _k3() -> Profile:
    model = ModelConfig(
        name="k3", vocab_size=160_000, d_model=7168, n_layers=93,
        kda_heads=96, kda_head_dim=128,
        mla_heads=96, mla_q_rank=1536, mla_kv_rank=512, mla_qk_nope_dim=128, mla_qk_rope_dim=64,
        mla_v_head_dim=128, mla_every=4,
        n_dense_layers=1, dense_hidden=18432,
        n_routed=896, top_k=16, n_shared=2, moe_latent_dim=3584, expert_hidden=3072, shared_hidden=3072,
        attn_res_block=12, mtp_depth=1, mtp_loss_weight=0.3,
        vision=VisionConfig(image_size=448, patch_size=14, d_model=1024, n_layers=27, n_heads=16,
                            mlp_hidden=4096),
        qat=True,
    )
    # K3's stages: 8K : 64K : 256K : 1M (the token budgets are not published; not instantiated).
    stages = tuple(StageConfig(seq_len=n, steps=0, batch_size=0, lr=0.0)
                   for n in (8192, 65536, 262144, 1048576))
    return Profile(name="k3", model=model, stages=stages, device="cluster")


def _small() -> Profile:
    # The shape of torchtitan's kimi_k3 `_debugmodel`, for one GPU.
    model = ModelConfig(
        name="small", vocab_size=16_384, d_model=1024, n_layers=24,
        kda_heads=8, kda_head_dim=128,
        mla_heads=16, mla_q_rank=512, mla_kv_rank=256, mla_qk_nope_dim=64, mla_qk_rope_dim=32,
        mla_v_head_dim=64, mla_every=4,
        n_dense_layers=1, dense_hidden=2816,
        n_routed=32, top_k=4, n_shared=2, moe_latent_dim=512, expert_hidden=384, shared_hidden=384,
        attn_res_block=12, mtp_depth=1, mtp_loss_weight=0.3, activation_checkpointing=True,
        vision=VisionConfig(image_size=64, patch_size=8, d_model=512, n_layers=8, n_heads=8,
                            mlp_hidden=2048),
    )
    # Stage 1 without activation checkpointing: 0.556 → 0.394 s a step, 92.5 GiB at 512 × 64 on the H200,
    # measured on the benchmark's model (no MTP head, no vision tower; docs/log/gpu.md); the longer
    # stages keep it. The product's stage 1 (with MTP and vision) needs more than the H200's 139 GiB
    # without it (out of memory at 136 GiB allocated: docs/log/gpu.md): below `checkpointing_off_gib` (150)
    # it keeps checkpointing, so on today's H100 and H200 alike.
    stages = (StageConfig(512, 2000, 64, 1e-3, activation_checkpointing=False, checkpointing_off_gib=150),
              StageConfig(4096, 400, 8, 5e-4),
              StageConfig(16384, 100, 2, 3e-4), StageConfig(65536, 25, 1, 2e-4))
    return Profile(name="small", model=model, stages=stages, device="cuda", optimizer="adamw")


def _tiny() -> Profile:
    model = ModelConfig(
        name="tiny", vocab_size=4096, d_model=128, n_layers=4,
        kda_heads=4, kda_head_dim=32,
        mla_heads=4, mla_q_rank=None, mla_kv_rank=64, mla_qk_nope_dim=32, mla_qk_rope_dim=16,
        mla_v_head_dim=32, mla_every=4,
        n_dense_layers=1, dense_hidden=384,
        n_routed=8, top_k=2, n_shared=1, moe_latent_dim=64, expert_hidden=128, shared_hidden=128,
        attn_res_block=2, mtp_depth=1, mtp_loss_weight=0.3,
        vision=VisionConfig(image_size=32, patch_size=8, d_model=64, n_layers=2, n_heads=4,
                            mlp_hidden=128),
    )
    # 1 : 8 : 32 : 128, as 8K : 64K : 256K : 1M in K3. 64 → 8K rather than 128 → 16K: the gated MLA
    # layer's T² attention makes one 16K forward cost ~6× an 8K one on a 2-core CPU.
    # Stage 1 learns the clue task in 700 clue-only steps of 32 rows: its answer loss sits on plateaus
    # (~1.4, ~0.6, ~0.3 nats) for a number of steps that differs from seed to seed, and 400 steps can
    # end on one (d0–32 accuracy 0.2–0.3), leaving the learning to the mixed steps, which are fragile.
    # The 600 mixed steps after them (16 clue rows a step) warm up again to a third of the peak lr.
    # Stage 2 (2 clue rows a step at 512) gets 250 steps to learn the longer distances (docs/log/tiny.md).
    # Stages 2–4 start from a trained router and step 2,048–8,192 tokens of 1–4 rows: the balancing
    # bias averages ≈ 32K tokens of quantile solutions instead of keeping the last step's; stage 1's
    # router, from random weights, drifts too fast for that and keeps K3's overwrite (docs/log/pretrain.md).
    window = 32_768
    stages = (StageConfig(64, 1300, 32, 3e-3, clue_warmup_steps=700, mixed_lr=1e-3),
              StageConfig(512, 250, 4, 2e-3, quantile_window_tokens=window),
              StageConfig(2048, 30, 2, 1e-3, quantile_window_tokens=window),
              StageConfig(8192, 8, 1, 5e-4, quantile_window_tokens=window))
    return Profile(name="tiny", model=model, stages=stages)


def _smoke() -> Profile:
    model = replace(
        _tiny().model, name="smoke", vocab_size=512, d_model=64, kda_heads=2, mla_heads=2,
        mla_kv_rank=32, dense_hidden=128, n_routed=4, expert_hidden=64, shared_hidden=64,
        moe_latent_dim=32,
        vision=VisionConfig(image_size=32, patch_size=8, d_model=32, n_layers=1, n_heads=2, mlp_hidden=64),
    )
    # The test profile is sized for speed and does not keep the 1 : 8 : 32 : 128 ratio.
    stages = (StageConfig(64, 4, 4, 3e-3), StageConfig(128, 2, 2, 2e-3),
              StageConfig(256, 2, 2, 1e-3), StageConfig(512, 2, 1, 5e-4))
    return Profile(name="smoke", model=model, stages=stages)


PROFILES: dict[str, Callable[[], Profile]] = {"smoke": _smoke, "tiny": _tiny, "small": _small, "k3": _k3}


def get_profile(name: str) -> Profile:
    """The named profile; unknown names raise ValueError listing the valid ones."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}: choose one of {', '.join(PROFILES)}")
    return PROFILES[name]()
