"""Deployment assets on the smoke profile: quantized_student and draft_model materialized through
Ray, MLflow and Dagster from real upstream files. sft_data is the real asset; base_model and
mopd_student are a smoke-shaped checkpoint reported as their materializations (training the whole
post-training lineage here would cost minutes: tests/pipelines' end-to-end run covers the chain)."""

from dataclasses import asdict

import dagster as dg
import pytest
import torch
from conftest import error_text

from assets import claims, deploy, posttrain, report
from assets.lineage import PROFILE_TAG, key, latest
from k3model.checkpoint import save_checkpoint
from k3model.config import get_profile
from k3model.draft import load_draft
from k3model.model import K3Model
from k3model.quantize import load_quantized

QUANTIZED, DRAFT = deploy.build("smoke")
SFT_DATA = posttrain.build("smoke")[0]
REPORT = report.build("smoke")


def _student(path):
    torch.manual_seed(0)
    model = K3Model(get_profile("smoke").model)
    return save_checkpoint(path, model.state_dict(), {"config": {"model": asdict(model.cfg)}})


def _report(instance, name, info):
    instance.report_runless_asset_event(dg.AssetMaterialization(
        asset_key=key("smoke", name), metadata={"path": dg.MetadataValue.path(str(info.path)), "sha256": info.sha256},
        tags={PROFILE_TAG: "smoke", "dagster/data_version": info.sha256}))


def test_quantized_student_and_draft_model_materialize(data_run, smoke_resources, tmp_path):
    instance, _ = data_run
    assert dg.materialize([SFT_DATA], instance=instance, resources=smoke_resources,
                          selection=[SFT_DATA.key]).success
    info = _student(tmp_path / "student")
    _report(instance, "base_model", info)
    _report(instance, "mopd_student", info)
    result = dg.materialize([QUANTIZED, DRAFT], instance=instance, resources=smoke_resources)
    assert result.success

    q = latest(instance, "smoke", "quantized_student").metadata
    assert q["audit/ok"] is True and q["ratio_to_bf16"] < 1.0
    assert q["expert_bytes"] * 64 == q["expert_bf16_bytes"] * 17  # 17/32 byte a value against 2
    # The product's scope (experts only) on the held-out windows, and claim 5 at every Linear: two seeds,
    # the RCEIL arms only on smoke (FLOOR repeats the QAT arm: tiny and small run both).
    assert q["product/kl_to_bf16"] > 0 and q["product/windows"] == "2 × 64"
    assert q["claim5/scope"] == "all_linear" and q["quant/scope"] == "all_linear" and q["quant/n"] == 2
    per_seed = q["claim5/seeds_figures"]
    assert set(per_seed) == {"0", "1"} and all(set(s) == {"bf16", "ceil"} for s in per_seed.values())
    assert all(s["ceil"][arm]["kl_to_bf16"] > 0 for s in per_seed.values() for arm in ("qat", "ptq"))
    model, manifest = load_quantized(latest(instance, "smoke", "quantized_student").path)
    assert manifest["quantization"]["scale_rounding"] == "ceil"

    # The draft targets what is served: quantized_student's packed export, loaded as `k3 serve` loads it,
    # measured on chat-formatted held-out task prompts; lossless against that model's greedy output.
    d = latest(instance, "smoke", "draft_model")
    assert d.metadata["greedy_parity_all"] is True and d.metadata["spec/lossless"] is True
    assert 1.0 <= d.metadata["tau_sim"] <= 4.0 and d.metadata["tau_sim_untrained"] >= 1.0
    assert d.metadata["model_version"].startswith("k3-smoke-draft_model/")
    assert d.metadata["spec/target_sha256"] == q["sha256"]
    assert d.metadata["spec/prompts"].startswith("chat-formatted first turns of 1 held-out envs tasks")
    by_depth = d.metadata["acceptance_by_depth_k4"]
    assert len(by_depth) == 4 and d.metadata["spec/acceptance_length/k4"] >= 1.0
    draft, manifest = load_draft(d.path, model)
    assert draft.cfg.vocab_size == 512 and manifest["draft"]["target_sha256"] == q["sha256"]
    assert manifest["target"]["quantization"] == "k3-mxfp4-experts-v1"

    # The report judges claims 5 and 6 from what these two assets wrote, by their numbers: claim 5 is
    # judged when PTQ's mean drop is ≥ 0.01 nats and ≥ 5× its seed spread, and passes exactly when QAT's
    # mean drop is at most half of PTQ's.
    assert dg.materialize(REPORT, instance=instance, resources=smoke_resources,
                          run_config={"ops": {"smoke__report": {"config": {"kernelsuite": "off"}}}}).success
    by = {c["number"]: c for c in latest(instance, "smoke", "report").metadata["claims"]}
    drops = {arm: [s["ceil"][arm]["drop"] for s in per_seed.values()] for arm in ("qat", "ptq")}
    drop_qat, drop_ptq = (sum(d) / 2 for d in (drops["qat"], drops["ptq"]))
    judged = drop_ptq >= 0.01 and drop_ptq >= 5 * (max(drops["ptq"]) - min(drops["ptq"]))
    assert by[5]["status"] == (claims.UNDERPOWERED if not judged else
                               claims.PASS if drop_qat <= 0.5 * drop_ptq else claims.FAIL)
    assert f"drop QAT {drop_qat:.4g}" in by[5]["figure"] and by[5]["checkpoints"] == {"quantized_student": q["sha256"]}
    assert by[6]["status"] in (claims.PASS, claims.FAIL) and "acceptance" in by[6]["figure"]


def test_deployment_assets_name_their_missing_upstream(smoke_resources):
    result = dg.materialize([DRAFT], instance=dg.DagsterInstance.ephemeral(), resources=smoke_resources,
                            raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "quantized_student" in failure.event_specific_data.error.message


def test_quantized_student_refuses_an_unknown_rounding(smoke_resources):
    with pytest.raises(Exception) as err:
        dg.materialize([QUANTIZED], instance=dg.DagsterInstance.ephemeral(), resources=smoke_resources,
                       run_config={"ops": {"smoke__quantized_student": {"config": {"scale_rounding": "even"}}}})
    assert "scale_rounding='even'" in error_text(err.value)


def test_quantized_student_refuses_an_unknown_scope_naming_the_valid_ones(smoke_resources):
    with pytest.raises(Exception) as err:
        dg.materialize([QUANTIZED], instance=dg.DagsterInstance.ephemeral(), resources=smoke_resources,
                       run_config={"ops": {"smoke__quantized_student": {"config": {"compare_scope": "dense"}}}})
    assert "compare_scope='dense' does not exist: use one of ('experts', 'all_linear')" in error_text(err.value)
