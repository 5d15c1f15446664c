"""MXFP4 export, load and inference of the routed experts, applied from outside the model
(torchao's prepare/convert; DESIGN.md §4 QAT; research/recipe.md §7; posttrain-anchors.md §4.4).

K3 quantizes the routed experts only (report §4.1.4): each expert weight W [E, N, K] (nn.Linear's
(out, in) layout, K the reduction dimension) is stored as MXFP4 — E2M1 codes, two a byte, and one
E8M0 scale byte per block of 32 along K — and its matmul inputs are MXFP8 (E4M3) at inference.
Router, latent projections, shared experts, attention, embeddings and the MTP module stay as the
model has them (fp32 / bf16).

    W_q = quantize_mx(W, "fp4_e2m1", 32, scale_rounding)        the one quantizer (kernels.mx)
    stored:   <name>_codes  uint8 [E, N, K/2]    element 2i low nibble, 2i+1 high nibble
              <name>_scales uint8 [E, N, K/32]   E8M0: 2^(byte − 127), 0xFF = NaN
    bytes per weight: K/2 + K/32 = 0.53125·K, against 2·K in bf16 (4.25 bits per value)

One quantizer serves QAT, PTQ, export and inference: `kernels.mx.fake_quant_mx` (QAT,
k3model/train/qat.py) is dequantize(quantize_mx(·)) with a straight-through gradient, so the weight
a QAT forward sees is exactly `MXTensor.dequantize()` of what `export_quantized` packs (tested bit
for bit; LatentMoE's extra STE wrapper w + sg(fq(w) − w) turns fq's −0.0 into +0.0 and nothing
else). At inference the packed weights run through `kernels.mx.mx_linear_experts` (the grouped
Triton GEMV on CUDA for ≤ 64 rows, the torch dequantize path otherwise and on the CPU), the
activations through `fake_quant_mx(·, "fp8_e4m3")` — what QAT fed the experts; MXFP8 values are
exact in bf16, so the kernel's bf16 rounding of its input changes nothing.

    info  = export_quantized(model, out_dir)        # a checkpoint (k3model.checkpoint) with packed experts
    qmodel, manifest = load_quantized(out_dir)      # K3Model whose LatentMoEs are MXLatentMoE
    generate(qmodel, prompt_BT)                     # k3model.generate
    audit_quantized(qmodel, prompt_BT)              # every expert weight went through the MX path

`convert_to_mx(model)` is PTQ in memory (the same packing, no file). Scale rounding: "ceil"
(torchao's RCEIL, never clips; the default) or "floor" (OCP §6.3; clips block maxima), both from
kernels.mx, so QAT prepared with one rounding and exported with the same agree bit for bit.

Legend: E routed experts, N output width, K reduction width, M tokens, K_top experts a token,
R = M·K_top routed rows, L latent width, H expert hidden.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.nn as nn

from kernels.mx.formats import SCALE_ROUNDINGS

from k3model.checkpoint import WEIGHTS_FILE, load_checkpoint, read_manifest, save_checkpoint
from k3model.config import ModelConfig, VisionConfig
from k3model.model import K3Model
from k3model.moe import MX_BLOCK, LatentMoE, situ_glu, sum_per_token

logger = logging.getLogger("k3model.quantize")

QUANT_FORMAT = "k3-mxfp4-experts-v1"
WEIGHT_FMT = "fp4_e2m1"
ACT_FMT = "fp8_e4m3"
# The routed expert weights of a LatentMoE, each [E, out, in] with the reduction dimension last.
EXPERT_WEIGHTS = ("w_gate_EHL", "w_up_EHL", "w_down_ELH")
CODES_SUFFIX = "_codes"
SCALES_SUFFIX = "_scales"


def quant_scheme(scale_rounding: str) -> dict[str, Any]:
    return {"format": QUANT_FORMAT, "modules": "LatentMoE routed experts", "weights": WEIGHT_FMT,
            "activations": ACT_FMT, "block_size": MX_BLOCK, "scale_rounding": scale_rounding,
            "quantizer": "kernels.mx.quantize_mx", "storage": "codes uint8 two a byte (low nibble first), "
            "E8M0 scales uint8 one a block"}


def _check_rounding(scale_rounding: str) -> None:
    if scale_rounding not in SCALE_ROUNDINGS:
        raise ValueError(f"scale_rounding={scale_rounding!r}: use 'ceil' (RCEIL, the default) or 'floor' (OCP)")


def _packed_shapes(shape_ENK: tuple[int, int, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(codes shape, scales shape) that quantize_mx gives for a weight [E, N, K] in MXFP4 blocks of 32."""
    e, n, k = shape_ENK
    kp = -(-k // MX_BLOCK) * MX_BLOCK
    return (e, n, kp // 2), (e, n, kp // MX_BLOCK)


def _expert_shapes(cfg) -> dict[str, tuple[int, int, int]]:
    E, L, H = cfg.n_routed, cfg.latent_dim, cfg.expert_hidden
    return {"w_gate_EHL": (E, H, L), "w_up_EHL": (E, H, L), "w_down_ELH": (E, L, H)}


# ------------------------------------------------------------------------------------------------
# The quantized LatentMoE (convert's target module)

class MXLatentMoE(LatentMoE):
    """A LatentMoE whose routed experts are packed MXFP4 buffers run by kernels.mx.mx_linear_experts.

    Routing, latent projections, latent norm and shared experts are LatentMoE's own (same
    parameters, same code); only `routed_experts` differs. Inference only: the expert matmuls have
    no backward. While `mx_calls` is a set, each expert weight that goes through the MX op adds its
    qualified name (`audit_quantized` sets it).
    """

    def __init__(self, cfg, scale_rounding: str = "ceil", weight_dtype: torch.dtype = torch.float32):
        _check_rounding(scale_rounding)
        for name in ("latent_dim", "expert_hidden"):
            if getattr(cfg, name) % MX_BLOCK:
                raise ValueError(f"MXFP4 experts quantize in blocks of {MX_BLOCK} along {name}, but the "
                                 f"model's {name} is {getattr(cfg, name)}: choose a multiple of {MX_BLOCK}")
        # QAT is a training mode of the float experts; the packed experts have nothing to fake-quantize.
        super().__init__(replace(cfg, qat=False))
        self.scale_rounding = scale_rounding
        self.weight_dtype = weight_dtype
        self.freeze_bias = True
        for name, shape in _expert_shapes(cfg).items():
            delattr(self, name)
            codes_shape, scales_shape = _packed_shapes(shape)
            self.register_buffer(name + CODES_SUFFIX, torch.zeros(codes_shape, dtype=torch.uint8))
            self.register_buffer(name + SCALES_SUFFIX, torch.zeros(scales_shape, dtype=torch.uint8))
        self.mx_calls: set[str] | None = None
        self.qualified_name = ""

    def mx_weight(self, name: str):
        """The expert stack `name` (one of EXPERT_WEIGHTS) as a kernels.mx MXTensor [E, N, K]."""
        from kernels.mx import MXTensor

        return MXTensor(getattr(self, name + CODES_SUFFIX), getattr(self, name + SCALES_SUFFIX), WEIGHT_FMT,
                        MX_BLOCK, _expert_shapes(self.cfg)[name], self.weight_dtype, self.scale_rounding)

    def load_packed(self, packed: dict[str, Any]) -> None:
        """Copy MXTensors {name: quantize_mx(w)} into the buffers."""
        for name in EXPERT_WEIGHTS:
            getattr(self, name + CODES_SUFFIX).copy_(packed[name].codes)
            getattr(self, name + SCALES_SUFFIX).copy_(packed[name].scales)

    def _act(self, a: torch.Tensor) -> torch.Tensor:
        from kernels.mx import fake_quant_mx

        return fake_quant_mx(a, ACT_FMT, MX_BLOCK, self.scale_rounding)

    def _experts(self, name: str, x_RK: torch.Tensor, ids_R: torch.Tensor) -> torch.Tensor:
        from kernels.mx import mx_linear_experts

        y_RN = mx_linear_experts(x_RK, self.mx_weight(name), ids_R)
        if self.mx_calls is not None:
            self.mx_calls.add(f"{self.qualified_name}.{name}")
        return y_RN

    @torch.no_grad()
    def routed_experts(self, z_ML: torch.Tensor, ids_MK: torch.Tensor, p_MK: torch.Tensor) -> torch.Tensor:
        """u_ML = Σ_{j∈I_m} p_mj E_j(z_m) with each (token, expert) row through its packed expert."""
        M, K = ids_MK.shape
        ids_R = ids_MK.reshape(-1)
        token_R = torch.arange(M, device=z_ML.device).repeat_interleave(K)
        z_RL = self._act(z_ML.index_select(0, token_R))
        h_RH = situ_glu(self._experts("w_gate_EHL", z_RL, ids_R), self._experts("w_up_EHL", z_RL, ids_R),
                        self.cfg.situ_beta1, self.cfg.situ_beta2)
        out_RL = self._experts("w_down_ELH", self._act(h_RH), ids_R)
        return sum_per_token(out_RL.float() * p_MK.reshape(-1, 1), token_R, M).to(z_ML.dtype)


# ------------------------------------------------------------------------------------------------
# Quantize (PTQ / export), convert

def _qat_rounding(moe: LatentMoE) -> str | None:
    """The scale rounding a QAT-prepared LatentMoE fake-quantizes with (None when QAT is off)."""
    fq = moe.fake_quant_mx
    if fq is None:
        return None
    return fq.keywords.get("scale_rounding", "ceil") if isinstance(fq, functools.partial) else "ceil"


def quantize_experts(moe: LatentMoE, scale_rounding: str = "ceil") -> dict[str, Any]:
    """{name: quantize_mx(w, "fp4_e2m1", 32, scale_rounding)} for the moe's three expert stacks.

    Raises ValueError when the moe fake-quantizes (QAT) with another scale rounding: the export
    would then not be the weights the model was trained to see."""
    from kernels.mx import quantize_mx

    _check_rounding(scale_rounding)
    trained = _qat_rounding(moe)
    if trained is not None and trained != scale_rounding:
        raise ValueError(f"this model was QAT-prepared with scale_rounding={trained!r} but is being "
                         f"quantized with {scale_rounding!r}: pass scale_rounding={trained!r}")
    return {name: quantize_mx(getattr(moe, name).detach(), WEIGHT_FMT, MX_BLOCK, scale_rounding)
            for name in EXPERT_WEIGHTS}


def _float_moes(model: nn.Module) -> list[tuple[str, LatentMoE]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, LatentMoE) and not isinstance(m, MXLatentMoE)]


def _replace_module(model: nn.Module, qualified: str, new: nn.Module) -> None:
    parent_name, _, child = qualified.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


def _swap_in_mx(model: nn.Module, scale_rounding: str, weight_dtype: torch.dtype) -> dict[str, MXLatentMoE]:
    """Replace every float LatentMoE by an MXLatentMoE holding the same non-expert state (packed
    buffers zero); returns {qualified name: new module}."""
    moes = _float_moes(model)
    if not moes:
        raise ValueError("the model has no LatentMoE to quantize: the MXFP4 scheme covers the routed experts "
                         "only, so the model needs MoE layers (n_layers > n_dense_layers)")
    swapped = {}
    for name, moe in moes:
        mx = MXLatentMoE(moe.cfg, scale_rounding, weight_dtype).to(moe.expert_bias_E.device)
        kept = {k: v for k, v in moe.state_dict().items() if k.split(".")[0] not in EXPERT_WEIGHTS}
        for key, t in [*mx.named_parameters(), *mx.named_buffers()]:
            if key in kept and t.dtype != kept[key].dtype:  # a bf16 model keeps its bf16 norms and projections
                t.data = t.data.to(kept[key].dtype)
        missing, unexpected = mx.load_state_dict(kept, strict=False)
        assert not unexpected and all(k.endswith((CODES_SUFFIX, SCALES_SUFFIX)) for k in missing), (missing, unexpected)
        mx.grouped_matmuls = moe.grouped_matmuls
        mx.qualified_name = name
        _replace_module(model, name, mx)
        swapped[name] = mx
    return swapped


@torch.no_grad()
def convert_to_mx(model: nn.Module, scale_rounding: str = "ceil") -> nn.Module:
    """PTQ in place (torchao's convert): each LatentMoE's routed experts packed to MXFP4 with
    kernels.mx.quantize_mx, the module replaced by an MXLatentMoE. Returns `model`."""
    packed = {name: quantize_experts(moe, scale_rounding) for name, moe in _float_moes(model)}
    dtypes = {getattr(moe, EXPERT_WEIGHTS[0]).dtype for _, moe in _float_moes(model)}
    for name, mx in _swap_in_mx(model, scale_rounding, dtypes.pop() if len(dtypes) == 1 else torch.float32).items():
        mx.load_packed(packed[name])
    return model


# ------------------------------------------------------------------------------------------------
# Export / load

@dataclass(frozen=True)
class ExportInfo:
    path: Path
    sha256: str
    file_bytes: int          # model.safetensors of the MXFP4 export
    bf16_file_bytes: int     # model.safetensors of the same model with every float tensor in bf16
    expert_bytes: int        # the packed routed experts (codes + scales)
    expert_bf16_bytes: int   # the same experts in bf16
    scale_rounding: str

    @property
    def ratio_to_bf16(self) -> float:
        return self.file_bytes / self.bf16_file_bytes


def _bf16_file_bytes(model: nn.Module) -> int:
    """Size of model.safetensors for the model with every floating tensor cast to bf16 (written to a
    temporary directory and measured: the honest comparison, header included)."""
    state = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in model.state_dict().items()}
    with tempfile.TemporaryDirectory() as tmp:
        info = save_checkpoint(Path(tmp) / "bf16", state)
        return (info.path / WEIGHTS_FILE).stat().st_size


@torch.no_grad()
def quantized_state_dict(model: K3Model, scale_rounding: str = "ceil") -> tuple[dict[str, torch.Tensor], dict]:
    """(state dict with each routed expert weight replaced by its packed codes and scales,
    {weight name: {"shape", "dtype"}}). Everything else is the model's own tensor, dtype unchanged."""
    state = dict(model.state_dict())
    tensors = {}
    for name, moe in _float_moes(model):
        for wname, q in quantize_experts(moe, scale_rounding).items():
            full = f"{name}.{wname}"
            del state[full]
            state[full + CODES_SUFFIX], state[full + SCALES_SUFFIX] = q.codes, q.scales
            tensors[full] = {"shape": list(q.shape), "dtype": str(q.dtype).removeprefix("torch.")}
    for name, moe in model.named_modules():
        if isinstance(moe, MXLatentMoE):
            raise ValueError(f"{name} is already MXFP4 (convert_to_mx ran): export the float model, or save "
                             "the converted one's state_dict as it is")
    if not tensors:
        raise ValueError("the model has no LatentMoE to quantize: the MXFP4 scheme covers the routed experts "
                         "only, so the model needs MoE layers (n_layers > n_dense_layers)")
    return state, tensors


def export_quantized(model: K3Model, directory: str | os.PathLike, scale_rounding: str = "ceil", *,
                     other_dtype: torch.dtype | None = None, manifest_extra: dict[str, Any] | None = None,
                     overwrite: bool = False) -> ExportInfo:
    """Write `model` with MXFP4 routed experts (packed) to a k3model.checkpoint directory and
    measure it against a bf16 export of the same model. Every other tensor keeps the model's dtype,
    or with `other_dtype` (e.g. torch.bfloat16, the deployment form) its floating tensors take that
    one, except the routing biases, which stay fp32 (their ~1e-3 steps decide the top-k). The
    manifest records the model config (as k3model.checkpoint.load_model expects it) and the quantization scheme
    with every packed tensor's shape."""
    state, tensors = quantized_state_dict(model, scale_rounding)
    if other_dtype is not None:
        state = {k: (v.to(other_dtype) if v.is_floating_point() and not k.endswith("expert_bias_E") else v)
                 for k, v in state.items()}
    expert_bytes = sum(state[n + s].numel() for n in tensors for s in (CODES_SUFFIX, SCALES_SUFFIX))
    expert_bf16 = sum(2 * torch.Size(t["shape"]).numel() for t in tensors.values())
    bf16_bytes = _bf16_file_bytes(model)
    extra = dict(manifest_extra or {})
    config = dict(extra.pop("config", {}))
    config["model"] = asdict(model.cfg)
    quant = {**quant_scheme(scale_rounding), "other_dtype": str(other_dtype).removeprefix("torch.") if other_dtype
             else "as the model", "tensors": tensors, "expert_bytes": expert_bytes,
             "expert_bf16_bytes": expert_bf16, "bf16_file_bytes": bf16_bytes}
    info = save_checkpoint(directory, state, {**extra, "config": config, "quantization": quant}, overwrite=overwrite)
    size = (info.path / WEIGHTS_FILE).stat().st_size
    logger.info("MXFP4 export %s: %d bytes against %d in bf16 (%.3f)", info.path, size, bf16_bytes, size / bf16_bytes)
    return ExportInfo(info.path, info.sha256, size, bf16_bytes, expert_bytes, expert_bf16, scale_rounding)


def is_quantized_manifest(manifest: dict[str, Any]) -> bool:
    quant = manifest.get("quantization")
    return isinstance(quant, dict) and quant.get("format") == QUANT_FORMAT


def _check_packed(weights: dict[str, torch.Tensor], quant: dict[str, Any], cfg: ModelConfig) -> None:
    """ValueError naming the tensor when a packed weight is missing or its codes/scales do not fit
    the shape the manifest records, or that shape not the model config's."""
    expected = _expert_shapes(cfg.moe())
    for name, meta in quant["tensors"].items():
        shape = tuple(meta["shape"])
        if shape != expected[name.rsplit(".", 1)[1]]:
            raise ValueError(f"{name} is recorded as {list(shape)} but the model config gives "
                             f"{list(expected[name.rsplit('.', 1)[1]])}: the manifest and config disagree; re-export")
        for suffix, want in zip((CODES_SUFFIX, SCALES_SUFFIX), _packed_shapes(shape)):
            t = weights.get(name + suffix)
            if t is None:
                raise ValueError(f"the checkpoint lacks {name + suffix}, which its manifest lists: re-export it")
            if t.dtype != torch.uint8 or tuple(t.shape) != want:
                what = "E8M0 scales" if suffix == SCALES_SUFFIX else "packed FP4 codes"
                raise ValueError(f"{name + suffix} holds {what} of shape {list(t.shape)} ({t.dtype}), but a weight "
                                 f"of shape {list(shape)} in MX blocks of {MX_BLOCK} needs {list(want)} (uint8): "
                                 "the checkpoint is corrupt or was packed with another block size; re-export it")


# The dtypes an export's float tensors may be recorded in: the name goes to getattr(torch, …), so
# it is looked up here first (a manifest naming "load" or "ops" must not reach arbitrary attributes).
EXPORT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Layer counts beyond this are no laptop-size model; the meta build that sizes a recorded config
# loops over layers, so the count is bounded before it runs.
_MAX_LAYERS = 1024


def _config_from(recorded: Any, cls: type, where: str) -> Any:
    """`cls(**recorded)` with every field of the type the dataclass declares, else ValueError naming it."""
    import dataclasses
    if not isinstance(recorded, dict):
        raise ValueError(f"{where} is a {type(recorded).__name__}, not a {cls.__name__} mapping: re-export")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(recorded) - set(fields))
    if unknown:
        raise ValueError(f"{where} has fields {unknown[:5]} that {cls.__name__} does not: re-export it")
    for name, value in recorded.items():
        kind = str(fields[name].type)
        ok = (isinstance(value, str) if kind == "str" else
              isinstance(value, bool) if kind == "bool" else
              isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
              and abs(value) < float("inf") if kind == "float" else
              (value is None or isinstance(value, int) and not isinstance(value, bool)) if kind == "int | None" else
              isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 31 if kind == "int" else
              True)
        if not ok:
            raise ValueError(f"{where}.{name} is {str(value)[:40]!r}, not a {kind} in range: re-export the checkpoint")
    try:
        return cls(**recorded)
    except TypeError as e:
        raise ValueError(f"{where} does not make a {cls.__name__} ({e}): re-export the checkpoint") from e


def model_config_from_manifest(manifest: dict[str, Any]) -> ModelConfig:
    config = manifest.get("config")
    if not isinstance(config, dict):
        raise ValueError("the manifest has no config mapping, so its model cannot be built: re-export it")
    recorded = dict(config.get("model") or {}) if isinstance(config.get("model"), dict) else config.get("model")
    if isinstance(recorded, dict) and recorded.get("vision") is not None:
        recorded["vision"] = _config_from(recorded["vision"], VisionConfig, "config.model.vision")
    return _config_from(recorded, ModelConfig, "config.model")


def _checked_quantization(directory: str | os.PathLike, manifest: dict[str, Any],
                          cfg: ModelConfig | None = None) -> torch.dtype:
    """The expert dtype an export's manifest records, after checking every quantization field it gives
    (scale rounding, packed tensor names and shapes, dtype names from EXPORT_DTYPES) and, given the
    recorded `cfg`, that the model it describes is no larger than its weights file can hold;
    ValueError naming the field otherwise."""
    quant = manifest["quantization"]
    if quant.get("scale_rounding") not in SCALE_ROUNDINGS:
        raise ValueError(f"{directory}: quantization.scale_rounding is {str(quant.get('scale_rounding'))[:40]!r}, "
                         f"not one of {sorted(SCALE_ROUNDINGS)}: re-export it")
    tensors = quant.get("tensors")
    if not isinstance(tensors, dict) or not tensors:
        raise ValueError(f"{directory}: quantization.tensors lists no packed tensors: re-export it")
    for name, meta in tensors.items():
        if not (isinstance(meta, dict) and isinstance(meta.get("shape"), list) and len(meta["shape"]) == 3
                and all(isinstance(d, int) and not isinstance(d, bool) and 0 < d < 1 << 31 for d in meta["shape"])):
            raise ValueError(f"{directory}: quantization.tensors[{name[:80]!r}] records shape "
                             f"{str(meta.get('shape') if isinstance(meta, dict) else meta)[:80]}, not three positive "
                             "sizes: re-export it")
        if not isinstance(meta.get("dtype"), str) or meta["dtype"] not in EXPORT_DTYPES:
            raise ValueError(f"{directory}: quantization.tensors[{name[:80]!r}] records dtype "
                             f"{str(meta.get('dtype'))[:40]!r}, not one of {sorted(EXPORT_DTYPES)}: re-export it")
    if cfg is not None and cfg.n_layers > _MAX_LAYERS:
        raise ValueError(f"{directory}: config.model.n_layers is {cfg.n_layers}, beyond {_MAX_LAYERS}: re-export it")
    # A packed expert weight takes at least half a byte per element and every other one at least two
    # bytes, so a config whose model needs more than twice the file's bytes in elements is not this file's.
    if cfg is not None:
        with torch.device("meta"):
            numel = sum(t.numel() for t in K3Model(cfg).state_dict().values())
        file_bytes = (Path(directory) / WEIGHTS_FILE).stat().st_size
    if cfg is not None and numel > 2 * file_bytes + (1 << 20):
        raise ValueError(f"{directory}: config.model describes {numel} parameters but {WEIGHTS_FILE} holds "
                         f"{file_bytes} bytes: the manifest is not this export's; re-export it")
    dtypes = {t["dtype"] for t in tensors.values()}
    return EXPORT_DTYPES[dtypes.pop()] if len(dtypes) == 1 else torch.float32


def load_quantized_into(model: K3Model, directory: str | os.PathLike, verify: bool = True) -> dict[str, Any]:
    """Load an MXFP4 export into `model`, which must already be converted (MXLatentMoE experts);
    returns the manifest. A plain model (float experts) raises ValueError: use load_quantized."""
    weights, manifest = load_checkpoint(directory, verify=verify, device=next(model.parameters()).device)
    if not is_quantized_manifest(manifest):
        raise ValueError(f"{directory} is not an MXFP4 export (no {QUANT_FORMAT} quantization block in its "
                         "manifest): load it with k3model.checkpoint.load_model")
    if _float_moes(model):
        raise ValueError(f"{directory} holds MXFP4-packed routed experts but this model's LatentMoEs have float "
                         "experts: build the model with k3model.quantize.load_quantized(directory), or "
                         "convert_to_mx(model) before loading")
    _checked_quantization(directory, manifest)
    quant = manifest["quantization"]
    listed, wanted = set(quant["tensors"]), set(quantized_weight_names(model))
    if listed != wanted:
        raise ValueError(f"{directory} packs {sorted(listed - wanted) or 'no other tensors'} beyond this model's "
                         f"routed experts and lacks {sorted(wanted - listed) or 'none of them'}: it was exported from "
                         "another architecture; load it with load_quantized(directory), which builds the recorded one")
    _check_packed(weights, quant, model.cfg)
    model.load_state_dict(weights)
    return manifest


def load_quantized(directory: str | os.PathLike, device: str | torch.device = "cpu",
                   verify: bool = True) -> tuple[K3Model, dict[str, Any]]:
    """The quantized model an MXFP4 export holds: K3Model from the recorded config, every LatentMoE
    an MXLatentMoE with the packed experts, everything else as exported. Returns (model, manifest)."""
    manifest = read_manifest(directory)
    if not is_quantized_manifest(manifest):
        raise ValueError(f"{directory} is not an MXFP4 export: load it with k3model.checkpoint.load_model")
    quant = manifest["quantization"]
    cfg = model_config_from_manifest(manifest)
    weight_dtype = _checked_quantization(directory, manifest, cfg)  # before anything is allocated
    model = K3Model(cfg)
    _swap_in_mx(model, quant["scale_rounding"], weight_dtype)
    load_quantized_into(model, directory, verify)
    return model.to(device).eval(), manifest


# ------------------------------------------------------------------------------------------------
# Audit

def quantized_weight_names(model: nn.Module) -> list[str]:
    """Every tensor the scheme means to run quantized: the routed expert stacks of every LatentMoE
    (float or converted), by qualified name."""
    return [f"{n}.{w}" for n, m in model.named_modules() if isinstance(m, LatentMoE) for w in EXPERT_WEIGHTS]


@contextlib.contextmanager
def recording_mx_calls(model: nn.Module) -> Iterator[set[str]]:
    """A set that collects the qualified name of every expert weight run through kernels.mx's
    MXFP4 op while the block runs."""
    calls: set[str] = set()
    mx_moes = [(n, m) for n, m in model.named_modules() if isinstance(m, MXLatentMoE)]
    for name, moe in mx_moes:
        moe.qualified_name, moe.mx_calls = name, calls
    try:
        yield calls
    finally:
        for _, moe in mx_moes:
            moe.mx_calls = None


@dataclass(frozen=True)
class AuditReport:
    expected: tuple[str, ...]
    quantized: tuple[str, ...]        # ran through the MXFP4 op in the prefill and in the decode step
    not_quantized: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.not_quantized


@torch.no_grad()
def audit_quantized(model: K3Model, input_ids_BT: torch.Tensor, strict: bool = True) -> AuditReport:
    """Run a prefill and one cached decode step and check that every routed expert weight of every
    LatentMoE went through the MXFP4 op (kernels.mx.mx_linear_experts) in both. With `strict`
    (default) a miss raises ValueError listing the tensors (the verl #7519 class of bug: a layer
    left in high precision while training fake-quantized it)."""
    expected = quantized_weight_names(model)
    if not expected:
        raise ValueError("the model has no LatentMoE: nothing is meant to run quantized")
    was_training = model.training
    model.eval()
    try:
        with recording_mx_calls(model) as prefill:
            out = model(input_ids_BT, use_cache=True)
        with recording_mx_calls(model) as decode:
            model(out.logits_BTV[:, -1].argmax(-1, keepdim=True), cache=out.cache)
    finally:
        model.train(was_training)
    missing = tuple(n for n in expected if n not in prefill or n not in decode)
    report = AuditReport(tuple(expected), tuple(n for n in expected if n not in missing), missing)
    if strict and missing:
        raise ValueError(f"{len(missing)} of {len(expected)} tensors meant to run MXFP4 did not go through the MX "
                         f"path at inference: {', '.join(missing)}; convert the model with convert_to_mx or load "
                         "it with load_quantized")
    return report


__all__ = [
    "MXLatentMoE", "ExportInfo", "AuditReport", "EXPERT_WEIGHTS", "QUANT_FORMAT", "SCALE_ROUNDINGS",
    "quant_scheme", "quantize_experts", "convert_to_mx", "quantized_state_dict", "export_quantized",
    "load_quantized", "load_quantized_into", "is_quantized_manifest", "model_config_from_manifest",
    "quantized_weight_names", "recording_mx_calls", "audit_quantized",
]
