"""Distillation assets through Dagster with real Ray and MLflow: mopd_student on two differently seeded
smoke SFT checkpoints (the student's and the nine teachers'), its metadata and manifest; a missing
teacher partition named. A subset of the routes (mopd_student.domains/efforts) is followed from the
config to the teachers and the training job on plain files, without training."""

import math
from dataclasses import asdict, replace

import dagster as dg
import pytest
import torch

from assets import distill
from assets.lineage import PROFILE_TAG, key
from datagen.profiles import presets
from datagen.corpus import build_corpus
from datagen.sft import SFTDataConfig, build_sft
from datagen.tokenizer import train_tokenizer
from k3model.checkpoint import load_checkpoint, verify_checkpoint
from k3model.config import get_profile
from k3model.model import K3Model
from k3model.train.common import save_state
from k3model.train.mopd import MOPDConfig
from k3model.train.sft import SFTConfig
from k3model.train.sft import train as sft_train

PARTITIONS = [f"{d}|{e}" for d in distill.DOMAINS for e in distill.EFFORTS]
MOPD, CROSS = distill.build("smoke")


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory):
    """A smoke tokenizer file and two smoke SFT checkpoints (seeds 0, 1) from one unbounded base."""
    root = tmp_path_factory.mktemp("distill")
    cfg = presets("smoke")
    tok = train_tokenizer(cfg.tokenizer, build_corpus(cfg.corpus))
    tok.save(str(root / "tokenizer.json"))
    demos = build_sft(SFTDataConfig(tasks_per_family=1, families=("arith_word",)), tok)
    torch.manual_seed(0)
    base = K3Model(replace(get_profile("smoke").model, name="smoke-unbounded"))
    save_state(root / "base", base, {"config": {"model": asdict(base.cfg)}})
    ckpts = [sft_train(SFTConfig(profile="smoke", seed=s, steps=2, batch_size=2, qat=False), demos, root / f"sft{s}",
                       init_checkpoint=root / "base").checkpoint_dir for s in (0, 1)]
    return root / "tokenizer.json", ckpts


def _report(instance, name, path, partition=None, **metadata):
    from k3model.checkpoint import sha256_file
    sha = verify_checkpoint(path).sha256 if path.is_dir() else sha256_file(path)
    instance.report_runless_asset_event(dg.AssetMaterialization(
        asset_key=key("smoke", name), partition=partition,
        metadata={"path": dg.MetadataValue.path(str(path)), "sha256": sha, **metadata},
        tags={PROFILE_TAG: "smoke", "dagster/data_version": sha}))


# The specialists' own held-out figures: given for all but general_agents|high, which the task plays.
FIGURES = {"eval/success_rate": 0.5, "eval/n": 2, "eval/mean_policy_tokens": 7.0}


def _instance(upstreams, partitions, tmp_path):
    import json
    import envs
    tok_path, (student, teacher) = upstreams
    ladder = {"tasks": {f"{d}/{e}": {"rl": [[t.family, t.seed] for t in envs.task_set(d, 2, seed=0)],
                                     "eval": [[t.family, t.seed] for t in envs.task_set(d, 2, seed=900)]}
                        for d in distill.DOMAINS for e in distill.EFFORTS}}
    (tmp_path / "ladder.json").write_text(json.dumps(ladder))
    instance = dg.DagsterInstance.ephemeral()
    _report(instance, "tokenizer", tok_path)
    _report(instance, "sft_policy", student)
    _report(instance, "rl_tasks", tmp_path / "ladder.json")
    for pk in partitions:
        _report(instance, "rl_specialist", teacher, partition=pk,
                **({} if pk == "general_agents|high" else FIGURES))
    return instance


def test_a_missing_teacher_partition_is_named(upstreams, smoke_resources, tmp_path):
    instance = _instance(upstreams, [p for p in PARTITIONS if p != "coding_agents|max"], tmp_path)
    result = dg.materialize([MOPD], instance=instance, resources=smoke_resources, raise_on_error=False,
                            selection=[MOPD.key])
    assert not result.success
    failure = [e for e in result.all_events if e.is_step_failure][0]
    message = failure.step_failure_data.error.message
    assert "rl_specialist partition(s) coding_agents|max have not been materialized" in message


@pytest.fixture
def files(tmp_path):
    """Plain files for the tokenizer, sft_policy and the teachers: enough for everything before training."""
    for name in ("tokenizer.json", "student.bin", "teacher.bin"):
        (tmp_path / name).write_text(name)
    return tmp_path / "tokenizer.json", (tmp_path / "student.bin", tmp_path / "teacher.bin")


def test_specialist_partitions_needs_only_the_routes_asked_for(files, tmp_path):
    instance = _instance(files, ["general_tasks|low", "coding_agents|low"], tmp_path)
    with dg.build_asset_context(instance=instance) as ctx:
        found = distill.specialist_partitions(ctx, "smoke", [("general_tasks", "low"), ("coding_agents", "low")])
        assert list(found) == ["general_tasks|low", "coding_agents|low"]
        assert found["coding_agents|low"].name == "rl_specialist/coding_agents/low"
        with pytest.raises(dg.Failure) as err:
            distill.specialist_partitions(ctx, "smoke", [("general_tasks", "low"), ("general_tasks", "high")])
    msg = err.value.description
    assert "needs the teacher of each of its 2 route(s): rl_specialist partition(s) general_tasks|high have not" in msg
    assert "--select '*rl_specialist' --partition 'general_tasks|high'" in msg
    assert "narrow the teachers with mopd_student.domains / mopd_student.efforts" in msg


class _Stop(Exception):
    pass


def _job_of(config, instance, monkeypatch):
    """The TrainingJob materialize_mopd_student hands to the training adapter (which is stopped there)."""
    jobs = []

    def stop(context, job):
        jobs.append(job)
        raise _Stop

    class Ray:
        def placement(self, n_tasks=1, log=None):
            return {"num_cpus": 1, "num_gpus": 0.0}

    monkeypatch.setattr(distill, "run_training", stop)
    resources = {"ray": Ray(), "store": object(), "mlflow": object()}
    with dg.build_asset_context(instance=instance, resources=resources) as ctx, pytest.raises(_Stop):
        MOPD(ctx, config)
    return jobs[0]


def test_a_route_subset_reaches_mopd_config_and_the_training_job(files, tmp_path, monkeypatch):
    # One teacher partition materialized: enough for a student of that one route.
    instance = _instance(files, ["general_tasks|low"], tmp_path)
    config = distill.MOPDStudentConfig(domains=["general_tasks"], efforts=["low"])
    job = _job_of(config, instance, monkeypatch)
    cfg, _, teachers, _, cells = job.args[:5]
    assert job.config is cfg and cfg.routes == [("general_tasks", "low")]
    assert (cfg.domains, cfg.efforts) == (("general_tasks",), ("low",))
    assert list(teachers) == list(cells) == ["general_tasks|low"]
    assert set(job.inputs) == {"sft_policy", "rl_tasks", "tokenizer", "rl_specialist/general_tasks/low"}
    assert job.description.startswith("smoke MOPD student: sft_policy distilled on-policy from 1 of the nine ")
    assert job.description.endswith("one checkpoint for effort(s) low")
    # Unset, every route, exactly as before the fields existed: all nine partitions are needed ...
    resources = {"ray": object(), "store": object(), "mlflow": object()}
    with dg.build_asset_context(instance=instance, resources=resources) as ctx, \
            pytest.raises(dg.Failure, match="general_tasks\\|high, "):
        MOPD(ctx, distill.MOPDStudentConfig())
    # ... and with them, the same MOPDConfig as one built without domains and efforts.
    full = _instance(files, PARTITIONS, tmp_path)
    cfg = _job_of(distill.MOPDStudentConfig(), full, monkeypatch).config
    assert (cfg.domains, cfg.efforts) == (MOPDConfig().domains, MOPDConfig().efforts) and len(cfg.routes) == 9


def test_a_subsets_metadata_names_the_cells_not_distilled():
    from types import SimpleNamespace
    cell = {"student": 0.5, "teacher": 0.5, "n": 2, "retention": 1.0, "ci95_low": 0.4, "ci95_high": 2.5,
            "student_tokens": 5.0, "teacher_tokens": 6.0}
    r = SimpleNamespace(retention={"general_tasks/low": cell}, history=[{"kl/general_tasks/low": 0.1,
                                                                         "rollout/tokens_per_answer/low": 4.0}],
                        evals={"general_tasks/low": {"mean_policy_tokens": 5.0}}, metrics={"eval/success_rate": 0.5},
                        teacher_manifest={"general_tasks|low": {"sha256": "ab" * 32}}, flops={"total": 1.0},
                        control=None)
    cfg = MOPDConfig(domains=("general_tasks",), efforts=("low",))
    meta = distill.mopd_metadata(r, cfg, {"general_tasks|low": None}, None)
    assert meta["not_distilled"].startswith("general_tasks/high, general_tasks/max, general_agents/low")
    assert len(meta["not_distilled"].split(", ")) == 8
    assert list(meta["retention_matrix"].value) == ["general_tasks/low"] and meta["retention/cells_defined"] == 1
    # Only the distilled effort's token use: no 0 for the efforts never played.
    assert [k for k in meta if "tokens_per_answer" in k] == ["tokens_per_answer/low", "train/tokens_per_answer/low"]


def test_the_control_verdict_states_its_power():
    from types import SimpleNamespace

    from k3model.train.stats import newcombe_power

    def meta(student: tuple[int, int], generalist: tuple[int, int]) -> dict:
        cell = {"student": 0.5, "teacher": 0.5, "n": 2, "retention": 1.0, "ci95_low": 0.4, "ci95_high": 2.5,
                "student_tokens": 5.0, "teacher_tokens": 6.0}
        control = {"flops": {"total": 2.0}, "budget": 2.0, "turns": [{}],
                   "evals": {"general_tasks/low": {"success_rate": generalist[0] / generalist[1],
                                                   "successes": generalist[0], "n": generalist[1]}}}
        r = SimpleNamespace(retention={"general_tasks/low": cell}, history=[], metrics={}, flops={"total": 1.0},
                            evals={"general_tasks/low": {"mean_policy_tokens": 5.0, "successes": student[0],
                                                         "n": student[1]}},
                            teacher_manifest={"general_tasks|low": {"sha256": "ab" * 32}}, control=control)
        return distill.mopd_metadata(r, MOPDConfig(domains=("general_tasks",), efforts=("low",)),
                                     {"general_tasks|low": None}, None)

    # 200 episodes an arm at 40 %: the interval holds 0, and ±5 points would rarely be seen.
    few = meta((82, 200), (80, 200))
    assert few["control/effect"] == 0.05
    assert few["control/power"] == pytest.approx(newcombe_power(0.4, 0.05, 200, 200)) and few["control/power"] < 0.8
    assert few["control/verdict"] == f"underpowered (power {few['control/power']:.2f} at ±5 points)"
    # 4000 an arm: the same null reading is now a finding.
    many = meta((1620, 4000), (1600, 4000))
    assert many["control/power"] > 0.99
    assert many["control/verdict"] == f"no difference at 95 % (power {many['control/power']:.2f} at ±5 points)"
    # An interval that excludes 0 is read as before, its power recorded beside it.
    assert meta((120, 200), (80, 200))["control/verdict"] == "MOPD consolidates better"
    assert meta((40, 200), (80, 200))["control/verdict"] == "the generalist consolidates better"


def test_teachers_at_another_budget_scale_are_refused(upstreams, smoke_resources, tmp_path):
    # Their reused held-out figures were played at another episode budget: not comparable.
    instance = _instance(upstreams, [], tmp_path)
    for pk in PARTITIONS:
        _report(instance, "rl_specialist", upstreams[1][1], partition=pk, **FIGURES,
                budget_scale=0.5 if pk == "coding_agents|low" else 1.0)
    result = dg.materialize([MOPD], instance=instance, resources=smoke_resources, raise_on_error=False,
                            selection=[MOPD.key])
    assert not result.success
    message = [e for e in result.all_events if e.is_step_failure][0].step_failure_data.error.message
    assert "budget_scale 1.0, but rl_specialist coding_agents|low was evaluated at 0.5" in message


def test_mopd_student_materializes_through_ray(upstreams, smoke_resources, tmp_path):
    instance = _instance(upstreams, PARTITIONS, tmp_path)
    result = dg.materialize([MOPD], instance=instance, resources=smoke_resources, selection=[MOPD.key])
    assert result.success
    meta = {k: v.value for k, v in result.asset_materializations_for_node("smoke__mopd_student")[0].metadata.items()}
    teacher_sha = verify_checkpoint(upstreams[1][1]).sha256
    # The manifest and the metadata name the nine teachers by checkpoint hash.
    _, manifest = load_checkpoint(meta["path"])
    assert set(manifest["teachers"]) == set(PARTITIONS)
    assert {t["sha256"] for t in manifest["teachers"].values()} == {teacher_sha}
    assert manifest["data_versions"]["student_init"] == verify_checkpoint(upstreams[1][0]).sha256
    assert set(meta["teachers"]) == set(PARTITIONS)
    assert len(meta["retention_matrix"]) == 9
    for cell, r in meta["retention_matrix"].items():
        assert r["n"] == 2 and 0 <= r["student"] <= 1
        # Reused figures where the specialist recorded them; played here (2 episodes) where not.
        if cell != "general_agents/high":
            assert r["teacher"] == 0.5 and r["teacher_tokens"] == 7.0
            assert r["retention"] == pytest.approx(r["student"] / 0.5)
        else:
            assert r["teacher_tokens"] > 0
    for e in distill.EFFORTS:
        assert meta[f"tokens_per_answer/{e}"] > 0
    assert meta["flops/total"] > 0 and meta["kl/exact/first"] > 0
    # A real update (issue 45 item 5): the teachers differ from the student, so the advantage
    # log π_T − log π_S is not 0, the loss is finite and not 0, and the weights moved.
    assert meta["sha256"] != verify_checkpoint(upstreams[1][0]).sha256
    losses = [m.value for m in smoke_resources["mlflow"].client().get_metric_history(
        meta["mlflow_run"].rsplit("/", 1)[1], "train/loss")]
    assert losses and all(math.isfinite(v) and v != 0 for v in losses)
    assert "kl_to_each_teacher" in meta and "teacher_retention" in meta
    # Its own figure: the retention heatmap, inline.
    assert meta["plot/teacher_retention"].startswith("![Teacher retention: student / teacher success](data:image/png")


def test_a_student_of_one_route_materializes_through_ray(upstreams, smoke_resources, tmp_path):
    # The one teacher partition there is; `k3 run --set mopd_student.domains='["general_tasks"]'` alike.
    instance = _instance(upstreams, ["general_tasks|low"], tmp_path)
    run_config = {"ops": {"smoke__mopd_student": {"config": {"domains": ["general_tasks"], "efforts": ["low"]}}}}
    result = dg.materialize([MOPD], instance=instance, resources=smoke_resources, selection=[MOPD.key],
                            run_config=run_config)
    assert result.success
    meta = {k: v.value for k, v in result.asset_materializations_for_node("smoke__mopd_student")[0].metadata.items()}
    _, manifest = load_checkpoint(meta["path"])
    assert set(manifest["teachers"]) == set(meta["teachers"]) == {"general_tasks|low"}
    assert list(meta["retention_matrix"]) == ["general_tasks/low"]
    assert meta["retention_matrix"]["general_tasks/low"]["n"] == 2
    assert len(meta["not_distilled"].split(", ")) == 8 and "coding_agents/max" in meta["not_distilled"]
    assert [k for k in meta if k.startswith("tokens_per_answer/")] == ["tokens_per_answer/low"]


def test_one_cross_harness_fold_materializes_through_ray(upstreams, smoke_resources, tmp_path):
    instance = _instance(upstreams, [], tmp_path)
    result = dg.materialize([CROSS], instance=instance, resources=smoke_resources, selection=[CROSS.key])
    assert result.success
    meta = {k: v.value for k, v in result.asset_materializations_for_node("smoke__cross_harness")[0].metadata.items()}
    assert meta["folds"] == "openclaw"
    assert meta["openclaw/general/harnesses"] == "kimi_code,claude_code,codex,hermes"
    assert meta["openclaw/single/harnesses"] == "kimi_code"
    for arm in ("general", "single"):
        assert meta[f"openclaw/{arm}/held_out/n"] == 2 and meta[f"openclaw/{arm}/in_harness/n"] == 2
        assert 0 <= meta[f"openclaw/{arm}/harness/openclaw/unparseable_rate"] <= 1
    # Both arms' checkpoints are kept and registered, each its own model.
    assert set(meta["arms"]) == {"openclaw|general", "openclaw|single"}
    assert meta["openclaw/sft_saw_held_out"] == "False"
    # sft_policy scored on the same tasks in the general arm's harnesses and the held-out one (claim 7's gain).
    assert meta["openclaw/sft/held_out/n"] == 2 and meta["openclaw/sft/in_harness/n"] == 2
    assert 0 <= meta["openclaw/sft/held_out/success_rate"] <= 1 and 0 <= meta["openclaw/sft/in_harness/success_rate"] <= 1
    assert "| openclaw | sft_policy | (SFT) |" in meta["transfer"]
