"""Pretraining assets: checks on real checkpoints, refusal of corrupted or missing inputs, bad
config. Real training through Ray and MLflow is exercised end to end in tests/pipelines/test_e2e.py."""

import dagster as dg
import pytest
import torch
from conftest import error_text

from assets import checkpoint_checks, evaluation, pretrain
from assets.display import markdown_table
from assets.evaluation import EvalConfig
from assets.lineage import PROFILE_TAG, key
from assets.pretrain import PretrainStageConfig, clue_tables
from k3model.checkpoint import WEIGHTS_FILE, save_checkpoint, sha256_file

ASSETS, CHECKS = pretrain.build("smoke")
# checkpoint_intact, as on every checkpoint asset, is built in assets/checkpoint_checks.py.
CHECKS = [*CHECKS, *checkpoint_checks.build("smoke", ASSETS)]
STAGE_ASSETS, base_model = ASSETS[:4], ASSETS[4]
[checkpoint_evals] = evaluation.build("smoke")


def _checkpoint(path, seed=0):
    torch.manual_seed(seed)
    return save_checkpoint(path, torch.nn.Linear(4, 3).state_dict(), {"config": {"test": True}})


def _report(instance, name, path, profile="smoke", **metadata):
    instance.report_runless_asset_event(dg.AssetMaterialization(
        asset_key=key(profile, name), metadata={"path": dg.MetadataValue.path(str(path)), **metadata},
        tags={PROFILE_TAG: profile}))


def _corrupt(path):
    weights = path / WEIGHTS_FILE
    raw = bytearray(weights.read_bytes())
    raw[-1] ^= 0xFF
    weights.write_bytes(bytes(raw))


def _check(asset_name, check_name):
    for c in CHECKS:
        if dg.AssetCheckKey(key("smoke", asset_name), check_name) in c.check_keys:
            return c
    raise KeyError((asset_name, check_name))


def _check_context(instance):
    return dg.build_asset_check_context(instance=instance)


def test_checkpoint_intact_passes_then_refuses_a_corrupted_file(tmp_path):
    instance = dg.DagsterInstance.ephemeral()
    info = _checkpoint(tmp_path / "ckpt")
    _report(instance, "pretrain_stage_1", info.path)
    check = _check("pretrain_stage_1", "checkpoint_intact")
    result = check(_check_context(instance))
    assert result.passed and result.metadata["sha256"].value == info.sha256

    _corrupt(info.path)
    result = check(_check_context(instance))
    assert not result.passed
    assert "is corrupted" in result.description and info.sha256 in result.description
    assert sha256_file(info.path / WEIGHTS_FILE) in result.description


def test_checkpoint_intact_without_a_checkpoint_fails():
    result = _check("base_model", "checkpoint_intact")(_check_context(dg.DagsterInstance.ephemeral()))
    assert not result.passed and "materialize it first" in result.description


@pytest.mark.parametrize("first, final, steps, passed, judged", [(6.0, 4.5, 10, True, True),
                                                                  (6.0, 6.2, 10, False, True),
                                                                  (6.0, 6.2, 2, True, False)])
def test_loss_fell(tmp_path, first, final, steps, passed, judged):
    instance = dg.DagsterInstance.ephemeral()
    _report(instance, "pretrain_stage_2", tmp_path, **{"train/first_loss": first, "train/final_loss": final,
                                                      "steps": steps})
    result = _check("pretrain_stage_2", "loss_fell")(_check_context(instance))
    assert result.passed is passed and result.severity == dg.AssetCheckSeverity.WARN
    assert f"{first:.4f} → {final:.4f}" in result.description
    assert result.metadata["judged"].value is judged
    assert result.description.startswith("not judged: 2 step(s) < 10") is not judged


def test_checks_read_their_own_profile(tmp_path):
    """A tiny checkpoint does not satisfy the smoke check, and the reverse."""
    instance = dg.DagsterInstance.ephemeral()
    _report(instance, "pretrain_stage_1", _checkpoint(tmp_path / "ckpt").path, profile="tiny")
    result = _check("pretrain_stage_1", "checkpoint_intact")(_check_context(instance))
    assert not result.passed and "smoke/pretrain_stage_1 has no checkpoint" in result.description


def test_stage_without_data_names_every_missing_asset(smoke_resources):
    with dg.build_asset_context(resources=smoke_resources, instance=dg.DagsterInstance.ephemeral()) as ctx, \
            pytest.raises(dg.Failure) as err:
        STAGE_ASSETS[0](ctx, PretrainStageConfig())
    msg = err.value.description
    assert "corpus, tokenizer, clue_data, image_data have not been materialized for profile 'smoke'" in msg
    assert "--select '*corpus,*tokenizer,*clue_data,*image_data'" in msg


def test_stage_refuses_to_start_from_a_corrupted_checkpoint(data_run, smoke_resources, tmp_path):
    instance, _ = data_run
    info = _checkpoint(tmp_path / "stage1")
    _corrupt(info.path)
    _report(instance, "pretrain_stage_1", info.path)
    with dg.build_asset_context(resources=smoke_resources, instance=instance) as ctx, \
            pytest.raises(dg.Failure) as err:
        STAGE_ASSETS[1](ctx, PretrainStageConfig())
    assert err.value.description.startswith("cannot start from pretrain_stage_1: checkpoint file")
    assert "is corrupted" in err.value.description


def test_base_model_needs_the_last_stage(smoke_resources):
    with dg.build_asset_context(resources=smoke_resources, instance=dg.DagsterInstance.ephemeral()) as ctx, \
            pytest.raises(dg.Failure, match="pretrain_stage_4 has not been materialized"):
        base_model(ctx)


def test_invalid_stage_config_names_the_field(smoke_resources):
    with dg.build_asset_context(resources=smoke_resources, instance=dg.DagsterInstance.ephemeral()) as ctx, \
            pytest.raises(dg.Failure) as err:
        STAGE_ASSETS[0](ctx, PretrainStageConfig(balancing="sometimes"))
    assert "ops.smoke__pretrain_stage_1.config" in err.value.description and "balancing" in err.value.description
    if not torch.cuda.is_available():
        with dg.build_asset_context(resources=smoke_resources, instance=dg.DagsterInstance.ephemeral()) as ctx, \
                pytest.raises(dg.Failure, match="compile_regions compiles for CUDA"):
            STAGE_ASSETS[0](ctx, PretrainStageConfig(compile_regions=True))
    with pytest.raises(Exception) as err:
        dg.materialize(STAGE_ASSETS[:1], resources=smoke_resources, instance=dg.DagsterInstance.ephemeral(),
                       run_config={"ops": {"smoke__pretrain_stage_1": {"config": {"steps": 0}}}})
    assert "steps" in error_text(err.value)
    with pytest.raises(Exception) as err:
        dg.materialize(STAGE_ASSETS[:1], resources=smoke_resources, instance=dg.DagsterInstance.ephemeral(),
                       run_config={"ops": {"smoke__pretrain_stage_1": {"config": {"quantile_window_tokens": -1}}}})
    assert "quantile_window_tokens" in error_text(err.value)


def test_balancing_ablation_refuses_bad_config_and_stays_beside_the_chain(smoke_resources):
    """Claim 2's arm pair: a balanced arm that does not balance, or more steps than stage 1, is refused
    naming the op's config; no stage or base_model depends on it, the report does."""
    ablation = next(a for a in ASSETS if a.key == key("smoke", "balancing_ablation"))
    for config, message in ((pretrain.BalancingAblationConfig(balanced="none"), "needs a balancing that balances"),
                            (pretrain.BalancingAblationConfig(balanced="sometimes"), "got 'sometimes'"),
                            (pretrain.BalancingAblationConfig(steps=5), r"steps must lie in \[1, 4\]")):
        with dg.build_asset_context(resources=smoke_resources, instance=dg.DagsterInstance.ephemeral()) as ctx, \
                pytest.raises(dg.Failure, match=message) as err:
            ablation(ctx, config)
        assert "ops.smoke__balancing_ablation.config" in err.value.description
    with pytest.raises(Exception) as err:
        dg.materialize([ablation], resources=smoke_resources, instance=dg.DagsterInstance.ephemeral(),
                       run_config={"ops": {"smoke__balancing_ablation": {"config": {"steps": 0}}}})
    assert "steps" in error_text(err.value)
    assert set(ablation.dependency_keys) == {key("smoke", n) for n in pretrain.DATA_INPUTS}
    for other in ASSETS:
        assert ablation.key not in other.dependency_keys, other.key
    from assets import report
    [report_asset] = report.build("smoke")
    assert ablation.key in report_asset.dependency_keys


def test_clue_tables_split_distance_and_length():
    ev = {"eval/clue_acc/scattered/d0-32": 1.0, "eval/clue_acc/control/d0-32": 1.0,
          "eval/clue_acc/scattered/d32-64": 0.5, "eval/clue_acc/scattered/len64": 0.75,
          "eval/clue_acc/scattered/len64/d0-32": 1.0, "eval/clue_acc/scattered/all": 0.75}
    by_distance, by_length = clue_tables(ev)
    assert by_distance.splitlines()[2:] == ["| 0-32 | 1 | 1 |", "| 32-64 | 0.5 | null |"]
    assert by_length.splitlines()[2:] == ["| 64 | 0.75 | null |"]
    # With the counts recorded, each row says how many pairs it scored.
    counted = {**ev, **{k.replace("clue_acc", "clue_n"): n for k, n in
                        (("eval/clue_acc/scattered/d0-32", 96.0), ("eval/clue_acc/scattered/d32-64", 4.0),
                         ("eval/clue_acc/scattered/len64", 100.0))}}
    by_distance, by_length = clue_tables(counted)
    assert by_distance.splitlines()[0] == "| distance | scattered | control | n |"
    assert by_distance.splitlines()[2:] == ["| 0-32 | 1 | 1 | 96 |", "| 32-64 | 0.5 | null | 4 |"]
    assert by_length.splitlines()[2:] == ["| 64 | 0.75 | null | 100 |"]


def test_tables_round_floats_and_sort_buckets_by_number():
    assert markdown_table([{"ppl": 440.45461830106336, "load": 1.1692708333333333}]).splitlines()[2] == \
        "| 440.5 | 1.169 |"
    ev = {f"eval/clue_acc/scattered/d{b}": 0.5 for b in ("0-32", "128-256", "256-512", "32-64", "64-128")}
    by_distance, _ = clue_tables(ev)
    assert [line.split(" | ")[0][2:] for line in by_distance.splitlines()[2:]] == \
        ["0-32", "32-64", "64-128", "128-256", "256-512"]


def test_checkpoint_evals_rejects_unknown_stages(smoke_resources):
    with dg.build_asset_context(resources=smoke_resources, instance=dg.DagsterInstance.ephemeral()) as ctx, \
            pytest.raises(dg.Failure, match=r"ops.smoke__checkpoint_evals.config.stages: \[0, 7\] are not stages"):
        checkpoint_evals(ctx, EvalConfig(stages=[1, 7, 0]))


def test_checkpoint_evals_names_the_missing_stage(data_run, smoke_resources, tmp_path):
    instance, _ = data_run
    with dg.build_asset_context(resources=smoke_resources, instance=instance) as ctx, \
            pytest.raises(dg.Failure, match="pretrain_stage_3 has not been materialized for profile 'smoke'"):
        checkpoint_evals(ctx, EvalConfig(stages=[3]))


def test_sparkline_shows_in_the_table_and_draws_the_curve():
    import base64
    import io

    from PIL import Image

    from assets.display import INLINE_MARKDOWN_CHARS, sparkline
    md = sparkline([6.0 - 0.01 * i for i in range(500)] + [float("nan")], "loss", "6.0 → 1.0").value
    assert len(md) < INLINE_MARKDOWN_CHARS and md.endswith(") 6.0 → 1.0")
    image = Image.open(io.BytesIO(base64.b64decode(md.split("base64,", 1)[1].split(")", 1)[0])))
    ys = {x: [y for y in range(image.height) if image.getpixel((x, y)) == 1] for x in (0, image.width - 1)}
    # A falling loss: the line starts at the top left and ends at the bottom right.
    assert max(ys[0]) < image.height // 3 and min(ys[image.width - 1]) > 2 * image.height // 3


def test_heldout_expert_load_measures_a_checkpoint_with_and_without_its_bias(tmp_path):
    """Claim 2's measurement as the stage asset runs it: a real checkpoint over the fixed held-out set."""
    from dataclasses import asdict

    import datagen
    from datagen.build import build_all
    from k3model.config import get_profile
    from k3model.model import K3Model
    from k3model.train.pretrain_data import PretrainData
    from k3model.train.expert_load import flat_metrics

    cfg = datagen.presets("smoke")
    build_all(cfg, tmp_path / "data")
    d = tmp_path / "data"
    data = PretrainData(d / "tokenizer.json", d / "corpus.parquet", d / "images.parquet", d / "clue_eval.parquet",
                        clues=cfg.clues)
    model_cfg = get_profile("smoke").model
    torch.manual_seed(0)
    model = K3Model(model_cfg)
    for m in model.moe_layers():
        m.expert_bias_E[0] = 10.0  # a bias that decides the routing: the two arms must differ
    save_checkpoint(tmp_path / "ckpt", model.state_dict(), {"config": {"model": asdict(model_cfg)}})
    measured = pretrain.heldout_expert_load(data, tmp_path / "ckpt")
    flat = flat_metrics(measured)
    assert flat["moe/heldout_tokens"] > 30_000
    assert set(measured["with_bias"]["tokens_by_kind"]) == {"text", "clue", "image"}
    assert flat["moe/heldout_load_max_over_mean"] == pytest.approx(model_cfg.n_routed / model_cfg.top_k)
    assert flat["moe/heldout_load_max_over_mean_bias_zeroed"] < flat["moe/heldout_load_max_over_mean"]
