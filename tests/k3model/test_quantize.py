"""k3model.quantize: one quantizer for QAT and the packed MXFP4 export, export → load → generate,
the inference audit, FLOOR against RCEIL scales, and the errors for bad checkpoints."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from kernels.mx import quantize_mx
from k3model.checkpoint import load_checkpoint, save_checkpoint
from k3model.config import get_profile
from k3model.generate import GenerationConfig, generate
from k3model.model import K3Model
from k3model.moe import LatentMoE
from k3model.checkpoint import load_model
from k3model.quantize import (
    CODES_SUFFIX, EXPERT_WEIGHTS, SCALES_SUFFIX, MXLatentMoE, audit_quantized, convert_to_mx, export_quantized,
    load_quantized, load_quantized_into, quantized_state_dict,
)
from k3model.train.qat import prepare_qat


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


def _qat_model(scale_rounding: str = "ceil", seed: int = 0) -> K3Model:
    torch.manual_seed(seed)
    model = K3Model(get_profile("smoke").model)
    # Spread the expert weights over several binades so that blocks differ in scale and some block
    # maxima sit where FLOOR clips (mantissa above 1.5).
    with torch.no_grad():
        for moe in model.moe_layers():
            for name in EXPERT_WEIGHTS:
                w = getattr(moe, name)
                w.mul_(torch.exp2(torch.empty(w.shape[:-1] + (1,)).uniform_(-3.0, 3.0)))
    return prepare_qat(model, scale_rounding).eval()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = _qat_model()
    info = export_quantized(model, tmp_path_factory.mktemp("q") / "mxfp4")
    qmodel, manifest = load_quantized(info.path)
    return model, info, qmodel, manifest


def test_qat_weight_is_the_dequantized_packed_export_bitwise(exported):
    model, _, qmodel, _ = exported
    for float_moe, mx_moe in zip(model.moe_layers(), qmodel.moe_layers()):
        assert isinstance(mx_moe, MXLatentMoE) and not isinstance(float_moe, MXLatentMoE)
        seen_by_forward = float_moe._expert_weights()  # what a QAT forward multiplies with
        for name, w_fwd in zip(EXPERT_WEIGHTS, seen_by_forward):
            deq = mx_moe.mx_weight(name).dequantize()
            # The quantizer QAT calls, bit for bit (signed zeros included).
            assert torch.equal(_bits(float_moe.fake_quant_mx(getattr(float_moe, name), "fp4_e2m1")), _bits(deq))
            # LatentMoE's STE wrapper w + sg(fq(w) − w): the same bits except −0.0 → +0.0 (x + (−x) = +0).
            nonzero = deq != 0
            assert torch.equal(_bits(w_fwd)[nonzero], _bits(deq)[nonzero])
            assert bool((w_fwd[~nonzero] == 0).all()) and int((~nonzero).sum()) > 0


def test_export_load_roundtrip_is_bitwise_and_packed(exported):
    model, info, qmodel, manifest = exported
    for (name, float_moe), mx_moe in zip(((n, m) for n, m in model.named_modules() if isinstance(m, LatentMoE)),
                                         qmodel.moe_layers()):
        for wname in EXPERT_WEIGHTS:
            w = getattr(float_moe, wname)
            ref = quantize_mx(w.detach(), "fp4_e2m1")
            loaded = mx_moe.mx_weight(wname)
            assert loaded.codes.dtype == torch.uint8 and loaded.codes.shape[-1] == w.shape[-1] // 2
            assert loaded.scales.shape[-1] == w.shape[-1] // 32
            assert torch.equal(loaded.codes, ref.codes) and torch.equal(loaded.scales, ref.scales)
            assert torch.equal(_bits(loaded.dequantize()), _bits(ref.dequantize()))
            assert manifest["quantization"]["tensors"][f"{name}.{wname}"]["shape"] == list(w.shape)
    # Everything that is not a routed expert comes back bit for bit, in the model's dtype.
    qstate = qmodel.state_dict()
    for key, value in model.state_dict().items():
        if key.rsplit(".", 1)[-1] not in EXPERT_WEIGHTS:
            assert qstate[key].dtype == value.dtype and torch.equal(qstate[key], value), key
    # Packed experts: K/2 + K/32 bytes a row against 2K in bf16.
    assert info.expert_bytes * 2 * 32 == info.expert_bf16_bytes * 17
    weights, _ = load_checkpoint(info.path)
    assert sum(v.numel() for k, v in weights.items() if k.endswith((CODES_SUFFIX, SCALES_SUFFIX))) == info.expert_bytes


def test_bf16_rest_export_is_smaller_than_bf16(exported, tmp_path):
    model = exported[0]
    info = export_quantized(model, tmp_path / "deploy", other_dtype=torch.bfloat16)
    weights, manifest = load_checkpoint(info.path)
    assert weights["embed.weight"].dtype == torch.bfloat16
    assert weights["layers.1.ffn.expert_bias_E"].dtype == torch.float32
    saved = info.expert_bf16_bytes - info.expert_bytes
    assert info.file_bytes < info.bf16_file_bytes and info.bf16_file_bytes - info.file_bytes >= 0.99 * saved
    qmodel, _ = load_quantized(info.path)
    assert qmodel.embed.weight.dtype == torch.float32
    assert torch.equal(qmodel.embed.weight, model.embed.weight.to(torch.bfloat16).float())


def test_quantized_model_computes_what_qat_computes_and_generates(exported):
    model, _, qmodel, _ = exported
    ids_BT = torch.randint(0, model.cfg.vocab_size, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        qat_logits, mx_logits = model(ids_BT).logits_BTV, qmodel(ids_BT).logits_BTV
    # Same weights and activations bit for bit; only the order of the fp32 sums may differ.
    torch.testing.assert_close(mx_logits, qat_logits, rtol=1e-5, atol=1e-6)
    ptq = convert_to_mx(copy.deepcopy(model))
    with torch.no_grad():
        assert torch.equal(ptq(ids_BT).logits_BTV, mx_logits)
    cfg = GenerationConfig(max_new_tokens=5)
    new_tokens = generate(qmodel, ids_BT, cfg)
    assert new_tokens.shape == (2, 5)
    assert torch.equal(new_tokens, generate(model, ids_BT, cfg))


def test_audit_passes_when_every_expert_runs_mx_and_names_the_ones_that_do_not(exported):
    model, _, qmodel, _ = exported
    ids_BT = torch.randint(0, model.cfg.vocab_size, (1, 7), generator=torch.Generator().manual_seed(2))
    report = audit_quantized(qmodel, ids_BT)
    assert report.ok and len(report.quantized) == 3 * len(qmodel.moe_layers())
    with pytest.raises(ValueError, match="9 of 9 tensors.*layers.1.ffn.w_gate_EHL"):
        audit_quantized(model, ids_BT)
    # One layer silently left in high precision (its experts dequantized into a float LatentMoE).
    partial = copy.deepcopy(qmodel)
    mx_moe = partial.layers[2].ffn
    float_moe = LatentMoE(mx_moe.cfg)
    float_moe.load_state_dict({**{k: v for k, v in mx_moe.state_dict().items() if not k.startswith("w_")},
                               **{n: mx_moe.mx_weight(n).dequantize() for n in EXPERT_WEIGHTS}})
    partial.layers[2].ffn = float_moe
    report = audit_quantized(partial, ids_BT, strict=False)
    assert report.not_quantized == tuple(f"layers.2.ffn.{n}" for n in EXPERT_WEIGHTS)
    with pytest.raises(ValueError, match="3 of 9 tensors.*layers.2.ffn.w_down_ELH"):
        audit_quantized(partial, ids_BT)


def test_floor_and_rceil_scales_share_the_quantizer(tmp_path):
    model = _qat_model("floor")
    info = export_quantized(model, tmp_path / "floor", scale_rounding="floor")
    qmodel, manifest = load_quantized(info.path)
    assert manifest["quantization"]["scale_rounding"] == "floor"
    moe, mx_moe = model.moe_layers()[0], qmodel.moe_layers()[0]
    w = moe.w_gate_EHL
    deq = mx_moe.mx_weight("w_gate_EHL").dequantize()
    assert torch.equal(_bits(moe.fake_quant_mx(w, "fp4_e2m1")), _bits(deq))
    ceil = quantize_mx(w.detach(), "fp4_e2m1", scale_rounding="ceil")
    # FLOOR picks one binade lower wherever the block maximum's mantissa exceeds 1.5, and clips it.
    lower = mx_moe.mx_weight("w_gate_EHL").scales.int() - ceil.scales.int()
    assert set(lower.unique().tolist()) == {-1, 0}
    clipped_E = (lower == -1).reshape(-1)
    assert bool(clipped_E.any())
    block_max = lambda t: t.detach().abs().reshape(-1, 32).amax(-1)  # noqa: E731
    assert bool((block_max(deq)[clipped_E] < block_max(w)[clipped_E]).all())
    with pytest.raises(ValueError, match="scale_rounding='floor'"):
        export_quantized(model, tmp_path / "mismatch", scale_rounding="ceil")
    with pytest.raises(ValueError, match="scale_rounding"):
        export_quantized(model, tmp_path / "bad", scale_rounding="nearest")
    with pytest.raises(ValueError, match="scale_rounding"):
        prepare_qat(K3Model(model.cfg), "nearest")


def test_bad_checkpoints_and_model_classes_raise_what_to_change(exported, tmp_path):
    model, info, _, manifest = exported
    with pytest.raises(ValueError, match="load_quantized"):
        load_model(info.path)
    with pytest.raises(ValueError, match="float experts.*load_quantized"):
        load_quantized_into(K3Model(model.cfg), info.path)
    shallower = convert_to_mx(K3Model(replace(model.cfg, n_layers=3)))
    with pytest.raises(ValueError, match=r"packs \['layers.3.ffn.w_down_ELH'.*another architecture"):
        load_quantized_into(shallower, info.path)
    state, _ = quantized_state_dict(model)
    key = "layers.1.ffn.w_down_ELH" + SCALES_SUFFIX
    state[key] = state[key][..., :-1].contiguous()
    extra = {k: manifest[k] for k in ("config", "quantization")}
    save_checkpoint(tmp_path / "corrupt", state, extra)
    with pytest.raises(ValueError, match=r"w_down_ELH_scales holds E8M0 scales of shape \[4, 32, 1\].*needs \[4, 32, 2\]"):
        load_quantized(tmp_path / "corrupt")
    with pytest.raises(ValueError, match="not an MXFP4 export"):
        load_quantized(save_checkpoint(tmp_path / "plain", model.state_dict(), {"config": extra["config"]}).path)
    odd = replace(model.cfg, moe_latent_dim=48)
    with pytest.raises(ValueError, match="multiple of 32"):
        convert_to_mx(K3Model(odd))


_INTERPRETED_LAYER = """
import json, logging, os, torch
from k3model.config import get_profile
from k3model.moe import LatentMoE
from k3model.quantize import MXLatentMoE, quantize_experts
logging.basicConfig(level=logging.INFO, format="%(message)s")
torch.manual_seed(0)
cfg = get_profile("smoke").model.moe()
float_moe = LatentMoE(cfg).eval()
mx = MXLatentMoE(cfg).eval()
mx.load_state_dict({k: v for k, v in float_moe.state_dict().items() if not k.startswith("w_")}, strict=False)
mx.load_packed(quantize_experts(float_moe))
x = torch.randn(1, 1, cfg.d_model)
with torch.no_grad():
    os.environ["TRITON_INTERPRET"] = "0"
    torch_path = mx(x)
    os.environ["TRITON_INTERPRET"] = "1"
    triton_path = mx(x)
print(json.dumps({"diff": float((torch_path - triton_path).abs().max()), "scale": float(torch_path.abs().max())}))
"""


def test_decode_step_takes_the_grouped_triton_gemv_in_the_interpreter():
    """The path a CUDA decode step takes (kernels.mx's grouped GEMV), run by Triton's interpreter
    in a subprocess (TRITON_INTERPRET must be set before triton is imported)."""
    pytest.importorskip("triton")
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1",
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, "-c", _INTERPRETED_LAYER], env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "mx_linear_experts: using the torch_dequant path" in run.stderr
    assert "mx_linear_experts: using the triton_gemv_grouped path" in run.stderr
    import json

    result = json.loads(run.stdout.strip().splitlines()[-1])
    # The GEMV accumulates in f16x2 (~4e-4 relative a matmul; docs/log/quantize.md).
    assert result["diff"] <= 5e-3 * result["scale"]


def test_a_bf16_model_converts_to_mx_and_keeps_its_dtypes():
    torch.manual_seed(0)
    model = K3Model(replace(get_profile("smoke").model, vision=None)).to(torch.bfloat16).eval()
    ptq = convert_to_mx(copy.deepcopy(model))
    dtypes = {k: v.dtype for k, v in model.state_dict().items()}
    assert all(v.dtype == dtypes[k] for k, v in ptq.state_dict().items() if k in dtypes)
    ids_BT = torch.randint(0, model.cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert ptq(ids_BT).logits_BTV.dtype == torch.bfloat16


def _hostile_export(exported, tmp_path, edit):
    """The export with its manifest edited and its hashes still consistent (as a hostile writer makes it)."""
    import json
    import shutil
    _, info, _, _ = exported
    copy_dir = tmp_path / "hostile"
    shutil.copytree(info.path, copy_dir)
    manifest = json.loads((copy_dir / "manifest.json").read_text())
    edit(manifest)
    (copy_dir / "manifest.json").write_text(json.dumps(manifest))
    return copy_dir


def _first_tensor(m):
    return next(iter(m["quantization"]["tensors"].values()))


@pytest.mark.parametrize("case, edit, message", [
    ("dtype an attribute", lambda m: _first_tensor(m).update(dtype="load"), r"records dtype 'load', not one of"),
    ("dtype a module", lambda m: _first_tensor(m).update(dtype="ops"), r"records dtype 'ops', not one of"),
    ("dtype a list", lambda m: _first_tensor(m).update(dtype=["float32"]), r"records dtype .*not one of"),
    ("shape strings", lambda m: _first_tensor(m).update(shape=["4", 32, 64]), "not three positive sizes"),
    ("rounding", lambda m: m["quantization"].update(scale_rounding="$(id)"), "scale_rounding is"),
    ("tensors a list", lambda m: m["quantization"].update(tensors=[1]), "lists no packed tensors"),
    ("config field type", lambda m: m["config"]["model"].update(d_model="64"), r"config.model.d_model is '64'"),
    ("config unknown field", lambda m: m["config"]["model"].update(evil=1), r"fields \['evil'\]"),
    ("config huge", lambda m: m["config"]["model"].update(vocab_size=2_000_000_000),
     "describes .* parameters but model.safetensors holds"),
    ("config many layers", lambda m: m["config"]["model"].update(n_layers=10 ** 6), "n_layers is 1000000, beyond"),
    ("config nan", lambda m: m["config"]["model"].update(norm_eps=float("nan")), "config.model.norm_eps is 'nan'"),
])
def test_a_hostile_export_manifest_is_refused_naming_the_field(exported, tmp_path, case, edit, message):
    directory = _hostile_export(exported, tmp_path, edit)
    with pytest.raises(ValueError, match=message):
        load_quantized(directory)
