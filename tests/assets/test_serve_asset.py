"""served_model on the smoke profile: what `k3 serve` would load, loaded and served once. The
tokenizer is the real asset; quantized_student and draft_model are a random smoke model's MXFP4
export and MTP draft reported as their materializations (tests/assets/test_deploy.py trains them)."""

from dataclasses import asdict

import dagster as dg
import torch

from assets import serve
from assets.lineage import PROFILE_TAG, key, latest
from k3model.checkpoint import save_checkpoint
from k3model.config import get_profile
from k3model.draft import draft_from_mtp, draft_manifest
from k3model.model import K3Model
from k3model.quantize import export_quantized

[SERVED] = serve.build("smoke")


def _report(instance, name, path, sha):
    instance.report_runless_asset_event(dg.AssetMaterialization(
        asset_key=key("smoke", name), metadata={"path": dg.MetadataValue.path(str(path)), "sha256": sha},
        tags={PROFILE_TAG: "smoke", "dagster/data_version": sha}))


def test_served_model_records_what_k3_serve_loads(data_run, smoke_resources, tmp_path):
    instance, _ = data_run
    torch.manual_seed(0)
    model = K3Model(get_profile("smoke").model).eval()
    q = export_quantized(model, tmp_path / "mxfp4", other_dtype=torch.bfloat16)
    draft = draft_from_mtp(model)
    d = save_checkpoint(tmp_path / "draft", draft.state_dict(), draft_manifest(draft))
    _report(instance, "quantized_student", q.path, q.sha256)
    _report(instance, "draft_model", d.path, d.sha256)
    assert dg.materialize([SERVED], instance=instance, resources=smoke_resources).success
    md = latest(instance, "smoke", "served_model").metadata
    assert md["model"] == str(q.path) and md["draft"] == str(d.path) and md["quantization"] == "mxfp4"
    assert md["model_sha256"] == q.sha256 and md["command"] == "k3 serve --profile smoke"
    assert md["context_length"] == 512 and set(md["reasoning_efforts"]) == {"low", "high", "max"}
    # The card ran through a real server: batch 1 decoded by the draft, batch 4 batched.
    assert md["card/speculative_requests_batch1"] == 1 and md["card/tokens_per_s_batch4"] > 0
    assert str(q.path) == str(latest(instance, "smoke", "quantized_student").path)


def test_served_model_names_its_missing_upstreams(smoke_resources):
    result = dg.materialize([SERVED], instance=dg.DagsterInstance.ephemeral(), resources=smoke_resources,
                            raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    text = failure.event_specific_data.error.message
    assert "quantized_student" in text and "draft_model" in text and "k3 run --profile smoke" in text
