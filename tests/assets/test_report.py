"""The report asset: on the smoke profile after two real pretraining stages (the rest of the lineage
missing), its claim checks, the metadata contract of the assets it reads, and `k3 report` with and
without a report."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from mlflow.tracking import MlflowClient

from assets import data, posttrain, pretrain, report
from assets.claims import DOMAINS, EFFORTS, FAIL, NOT_MEASURED, PASS
from assets.lineage import PROFILE_TAG, key
from assets.plots import report_plots
from pipelines.cli import main
from pipelines.instance import dagster_home

STAGE_ASSETS = pretrain.build("smoke")[0][:2]
REPORT = report.build("smoke")
# Every step logged (the report draws the curves from MLflow), one clue pair per cell (smoke's own).
STAGE_CONFIG = {"ops": {f"smoke__pretrain_stage_{s}": {"config": {"log_every": 1}} for s in (1, 2)}}


@pytest.fixture(scope="module")
def reported(home, smoke_resources):
    """(instance, result) of the smoke data and stages 1-2, then the report, in the instance under
    `home` (where `k3 report` looks)."""
    instance = dg.DagsterInstance.from_config(str(dagster_home(home)))
    lineage = dg.materialize([*data.build("smoke"), *STAGE_ASSETS], instance=instance,
                             resources=smoke_resources, run_config=STAGE_CONFIG)
    assert lineage.success
    result = dg.materialize(REPORT, instance=instance, resources=smoke_resources)
    assert result.success
    yield instance, result
    instance.dispose()


def _claims(instance):
    md = instance.get_latest_materialization_event(key("smoke", "report")).asset_materialization.metadata
    return {c["number"]: c for c in md["claims"].value}, {k: v.value for k, v in md.items()}


def test_the_report_reports_what_exists_and_marks_the_rest(reported, home):
    instance, result = reported
    by, md = _claims(instance)
    assert sorted(by) == list(range(1, 9))
    stage_hashes = {f"pretrain_stage_{s}": instance.get_latest_materialization_event(
        key("smoke", f"pretrain_stage_{s}")).tags["dagster/data_version"] for s in (1, 2)}
    # Claim 1 is judged on the two stages that exist, with their checkpoint hashes.
    assert by[1]["status"] in (PASS, FAIL) and by[1]["checkpoints"] == stage_hashes
    # Claim 2: each stage's final checkpoint is measured on the held-out mixed set, with its bias and
    # with the bias zeroed (the "without" arm on smoke, where no stage trains without balancing).
    assert by[2]["status"] in (PASS, FAIL) and by[2]["figure"].startswith("with stage 1 ")
    assert "bias zeroed" in by[2]["figure"]
    assert all(by[n]["status"] == NOT_MEASURED and by[n]["checkpoints"] == {} for n in (3, 4, 5, 6, 7))
    # Claim 8 is measured by the report itself, on a sample of the kernel-suite corpus.
    assert by[8]["status"] == PASS and "a sample of the corpus (1/" in by[8]["reason"]
    assert all(c["profile"] == "smoke" for c in by.values())

    text = Path(md["path"]).read_text()
    out = Path(md["path"]).parent
    assert text.startswith("# K3 recipe claims report — profile `smoke`")
    # report.md's images load beside it on disk and in MLflow's artifacts: both keep the PNGs under plots/.
    assert "_not measured: no specialist and SFT evaluations_" in text
    assert "![Loss curves per stage](plots/loss_curves.png)" in text
    for name in ("loss_curves", "clue_accuracy", "expert_load"):
        assert (out / "plots" / f"{name}.png").is_file()
        assert md[f"plot/{name}"].startswith(f"![{report.PLOT_TITLES[name]}](data:image/png;base64,")
    # Dagster's Markdown cannot load local files: its copy links each plot to the page, no broken images.
    page = f"/k3/report/smoke/{result.run_id}"
    assert next(iter(md)) == "report_page" and md["report_page"] == page
    assert "![" not in md["report"] and f"]({page}#plot-loss_curves)" in md["report"]
    # The page: self-contained, the claims table, each claim, every drawn plot inline.
    html = (out / "report.html").read_text()
    assert html.count('src="data:image/png;base64,') == sum(isinstance(v, str) and v.startswith("![")
                                                            for k, v in md.items() if k.startswith("plot/"))
    assert 'src="http' not in html and "plots/" not in html
    assert all(f'id="claim-{n}"' in html for n in range(1, 9)) and 'id="plot-loss_curves"' in html
    assert "not measured: the draft model reports no acceptance lengths" in html
    assert md["plot/acceptance"] == "not measured: the draft model reports no acceptance lengths"
    assert md["claims/pass"] + md["claims/fail"] + md["claims/not_measured"] == 8

    # One check per claim, warning (never blocking) when the claim fails.
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert sorted(checks) == [f"claim_{n}" for n in range(1, 9)]
    assert all(e.severity == dg.AssetCheckSeverity.WARN for e in checks.values())
    assert checks["claim_1"].passed is (by[1]["status"] != FAIL) and checks["claim_3"].passed

    client = MlflowClient(f"sqlite:///{home.resolve() / 'mlflow' / 'mlflow.db'}")
    run_id = md["mlflow_run"].rsplit("/", 1)[1]
    assert {a.path for a in client.list_artifacts(run_id)} >= {"report.md", "report.html", "plots", "claims.json"}
    assert {a.path for a in client.list_artifacts(run_id, "plots")} >= {"plots/loss_curves.png"}
    assert client.get_run(run_id).data.metrics["claims/not_measured"] == md["claims/not_measured"]


def test_report_depends_on_what_it_reads():
    [asset] = REPORT
    assert {k.path[-1] for k in asset.dependency_keys} == set(report.upstream_names())
    assert {"pretrain_stage_4", "base_model"} <= set(report.upstream_names())


def test_a_failing_claim_warns():
    verdicts = {n: {"number": n, "title": "", "status": status, "figure": f"figure {n}", "target": "t",
                    "reason": "r", "profile": "smoke", "checkpoints": {"sft_policy": "ab"}}
                for n, status in ((3, FAIL), (4, PASS), (5, NOT_MEASURED))}
    failing = report.claim_check(verdicts[3])
    assert failing.check_name == "claim_3" and failing.passed is False
    assert failing.severity == dg.AssetCheckSeverity.WARN and failing.description.startswith("fail: figure 3")
    assert report.claim_check(verdicts[4]).passed is True
    assert report.claim_check(verdicts[5]).passed is True and "not measured" in report.claim_check(verdicts[5]).description


def test_the_claims_are_checks_of_the_report_step():
    """The eight checks belong to the report's own op: no separate check step a re-execution can drop."""
    [asset] = REPORT
    assert sorted(k.name for k in asset.check_keys) == [f"claim_{n}" for n in range(1, 9)]
    assert asset.node_def.name == "smoke__report"


def test_the_contract_of_the_assets_it_reads(tmp_path, smoke_resources):
    """Hand-made materializations with the metadata keys of assets/claims.py's table: every
    post-training claim is judged from them."""
    instance = dg.DagsterInstance.ephemeral()

    def put(name, metadata, partition=None):
        instance.report_runless_asset_event(dg.AssetMaterialization(
            asset_key=key("smoke", name), partition=partition, tags={PROFILE_TAG: "smoke"},
            metadata={"path": dg.MetadataValue.path(str(tmp_path)), "sha256": f"{name}{partition or ''}", **metadata}))
    cells = [(d, e) for d in DOMAINS for e in EFFORTS]
    put("sft_policy", {"evals": dg.MetadataValue.json({"sft_policy": {f"{d}/{e}": {"success_rate": 0.9, "n": 100}
                                                                      for d, e in cells}})})
    for i, (d, e) in enumerate(cells):
        # The specialist's own SFT figure (its tasks) wins over sft_policy's (0.9 would fail claim 3).
        # 900 paired tasks (claim 3 powered for all nine cells): 370 only the specialist solved, 10 only
        # SFT (0.6 against 0.2).
        put("rl_specialist", {"eval/success_rate": 0.6, "eval/n": 900, "eval/mean_policy_tokens": 10.0 * (1 + i % 3),
                              "eval/hard/success_rate": 0.3, "eval/hard/n": 40, "sft_policy/success_rate": 0.2,
                              "sft_policy/n": 900, "paired/b": 370, "paired/c": 10, "paired/n": 900,
                              **({"sft_policy/hard/success_rate": 0.1, "sft_policy/hard/n": 40} if e == "low" else {})},
            partition=str(dg.MultiPartitionKey({"domain": d, "effort": e})))
    put("mopd_student", {"retention_matrix": dg.MetadataValue.json(
        {f"{d}/{e}": {"student": 0.5, "teacher": 0.6, "n": 400} for d, e in cells})})
    put("quantized_student", {"quant/metric": "ppl", "quant/higher_is_better": False, "quant/qat/bf16": 50.0,
                              "quant/qat/mxfp4": 50.5, "quant/ptq/bf16": 50.0, "quant/ptq/mxfp4": 53.0,
                              "quant/seed_drops": dg.MetadataValue.json({"qat": [0.4, 0.6], "ptq": [2.9, 3.1]}),
                              "quant/n": 8, "quant/scope": "all_linear"})
    put("draft_model", {"spec/acceptance_length/k1": 1.6, "spec/acceptance_length/k4": 2.2,
                        "spec/speedup/k4": 1.3, "spec/lossless": True})
    put("cross_harness", {"folds": "xml,json", "xml/general/in_harness/success_rate": 0.5,
                          "xml/general/held_out/success_rate": 0.45, "json/general/in_harness/success_rate": 0.4,
                          "json/general/held_out/success_rate": 0.34, "xml/single/in_harness/success_rate": 0.5,
                          "xml/single/held_out/success_rate": 0.1,
                          **{f"{h}/general/{w}/n": 1024 for h in ("xml", "json") for w in ("in_harness", "held_out")},
                          **{f"{h}/sft/{w}/success_rate": 0.2 for h in ("xml", "json") for w in ("in_harness", "held_out")}})
    by = {c.number: c for c in report.judge(report.gather(instance, "smoke"), None)}
    assert by[3].status == PASS and by[3].checkpoints["sft_policy"] == "sft_policy"
    assert len([n for n in by[3].checkpoints if n.startswith("rl_specialist[")]) == 9
    assert by[3].n == 900 and by[3].power >= 0.8 and by[3].figures["hard"]["general_tasks"] == "pass"
    assert by[4].status == FAIL and "retained 75%" in by[4].reason  # (0.5 − 0.2) of (0.6 − 0.2)
    assert by[5].status == PASS and by[5].figures["drop_ptq"] == pytest.approx(3.0) and by[5].n == 8
    assert by[5].figures["ptq_seed_spread"] == pytest.approx(0.2) and by[5].figures["scope"] == "all_linear"
    assert by[6].status == FAIL and "2.20 < 2.5" in by[6].reason
    # Gains in the held-out harness: xml +25 of +30 points, json +14 of +20: 70 %.
    assert by[7].status == FAIL and by[7].reason == "the worst fold (json held out) keeps 70% of its RL gain"
    assert "single-harness control xml 20%" in by[7].figure
    assert by[1].status == NOT_MEASURED and by[8].status == NOT_MEASURED
    drawn = report_plots(report.gather(instance, "smoke"), list(by.values()), tmp_path / "plots")
    assert all(isinstance(drawn[n], Path) for n in ("specialists_vs_sft", "tokens_by_effort", "teacher_retention",
                                                    "quantization", "acceptance"))
    # The page shows the nine side by side under claim 3, and every drawn plot inline.
    html = report.render_html("smoke", list(by.values()), drawn, run="r1", links={})
    assert html.count("SFT 0.20 → 0.60, +40 [+") == 9 and html.count("; ✓</td>") == 9
    assert html.count('src="data:image/png;base64,') == sum(isinstance(v, Path) for v in drawn.values())

    # rl_specialist's overview: the nine as this run made them (`fresh`) and as the instance holds the rest.
    worse = {"eval/success_rate": 0.25, "eval/n": 900, "sft_policy/success_rate": 0.2, "sft_policy/n": 900,
             "paired/b": 60, "paired/c": 15, "paired/n": 900, "eval/mean_policy_tokens": 10.0,
             "reward_by_step": dg.MetadataValue.json([0.1, 0.2, 0.3])}
    with dg.build_asset_context(resources=smoke_resources, instance=instance) as ctx:
        led = posttrain._with_the_nine(ctx, "smoke", {"coding_agents|max": worse})
    nine = led["coding_agents|max"]
    assert list(nine)[:2] == ["specialists_3x3", "plot/specialists"] and nine["eval/success_rate"] == 0.25
    table = nine["specialists_3x3"].value
    assert table.count("SFT 0.20 → 0.60") == 8 and "SFT 0.20 → 0.25, +5 [" in table
    assert table.startswith("**claim 3 fail**: 8/9 specialists") and table.count("; ✓") == 8 and "; ✗" in table
    assert len(table) < 1000  # short enough for the UI to show it in the metadata table itself
    assert nine["plot/specialists"].value.startswith("![The nine specialists")


def test_a_student_of_one_route_is_judged_on_its_one_cell(tmp_path):
    """mopd_student distilled from general_tasks|low alone (mopd_student.domains/efforts): its retention
    matrix has one cell; claim 4 reads that one, the heatmap marks the other eight not distilled."""
    instance = dg.DagsterInstance.ephemeral()

    def put(name, metadata, partition=None):
        instance.report_runless_asset_event(dg.AssetMaterialization(
            asset_key=key("smoke", name), partition=partition, tags={PROFILE_TAG: "smoke"},
            metadata={"path": dg.MetadataValue.path(str(tmp_path)), "sha256": name, **metadata}))
    put("sft_policy", {"evals": dg.MetadataValue.json({"sft_policy": {f"{d}/{e}": {"success_rate": 0.2, "n": 900}
                                                                      for d in DOMAINS for e in EFFORTS}})})
    put("rl_specialist", {"eval/success_rate": 0.6, "eval/n": 900, "eval/mean_policy_tokens": 10.0,
                          "sft_policy/success_rate": 0.2, "sft_policy/n": 900, "paired/b": 370, "paired/c": 10,
                          "paired/n": 900}, partition=str(dg.MultiPartitionKey({"domain": "general_tasks",
                                                                                "effort": "low"})))
    put("mopd_student", {"retention_matrix": dg.MetadataValue.json(
        {"general_tasks/low": {"student": 0.59, "teacher": 0.6, "n": 900}})})
    by = {c.number: c for c in report.judge(report.gather(instance, "smoke"), None)}
    assert set(by[4].figures["cells"]) == {"general_tasks/low"} and len(by[4].figures["not_distilled"]) == 8
    assert by[4].status == PASS and "8 of 9 not distilled" in by[4].figure  # (0.59 − 0.2) of (0.6 − 0.2)
    drawn = report_plots(report.gather(instance, "smoke"), list(by.values()), tmp_path / "plots")
    assert isinstance(drawn["teacher_retention"], Path)


def test_claim_2_is_judged_on_the_heldout_measurement(tmp_path):
    """Stages that carry the held-out expert load (assets/pretrain.py) are judged on it, with the
    bias-zeroed arm as the labelled "without" when no stage trained without balancing."""
    instance = dg.DagsterInstance.ephemeral()
    (tmp_path / "manifest.json").write_text(json.dumps({"config": {"model": {"balancing": "quantile"}}}))
    for s, (held, zeroed) in enumerate([(1.10, 2.4), (1.20, 2.0), (1.30, 1.96), (1.25, 2.2)], start=1):
        instance.report_runless_asset_event(dg.AssetMaterialization(
            asset_key=key("smoke", f"pretrain_stage_{s}"), tags={PROFILE_TAG: "smoke"},
            metadata={"path": dg.MetadataValue.path(str(tmp_path)), "sha256": f"s{s}",
                      "moe/load_max_over_mean": 1.59,  # the noisy training figure: not what is judged
                      "moe/heldout_load_max_over_mean": held, "moe/heldout_load_max_over_mean_bias_zeroed": zeroed,
                      "moe/heldout_dead_fraction": 0.0, "moe/heldout_per_batch_sd": 0.1,
                      "moe/heldout_per_batch_max": 1.5, "moe/heldout_tokens": 65512.0}))
    by = {c.number: c for c in report.judge(report.gather(instance, "smoke"), None)}
    c2 = by[2]
    assert c2.status == PASS, c2.line()
    assert c2.figures["with"] == {"stage 1": 1.10, "stage 2": 1.20, "stage 3": 1.30, "stage 4": 1.25}
    assert "bias zeroed" in c2.figures["without_source"] and "65512 tokens" in c2.figure


def test_claim_2_takes_without_from_the_balancing_ablation(tmp_path):
    """With `balancing_ablation` materialized, the "without" side is its arm trained with none, judged
    against its balanced twin at the same steps, in place of the bias-zeroed stand-in; the stages and
    the twin are the "with" side, and the arms' load curves reach the plot."""
    instance = dg.DagsterInstance.ephemeral()
    (tmp_path / "manifest.json").write_text(json.dumps({"config": {"model": {"balancing": "quantile"}}}))
    held = {"moe/heldout_dead_fraction": 0.0, "moe/heldout_per_batch_sd": 0.1, "moe/heldout_per_batch_max": 1.5,
            "moe/heldout_tokens": 65512.0}
    for s in range(1, 5):
        instance.report_runless_asset_event(dg.AssetMaterialization(
            asset_key=key("smoke", f"pretrain_stage_{s}"), tags={PROFILE_TAG: "smoke"},
            metadata={"path": dg.MetadataValue.path(str(tmp_path)), "sha256": f"s{s}",
                      "moe/heldout_load_max_over_mean": 1.2 + 0.05 * s,
                      "moe/heldout_load_max_over_mean_bias_zeroed": 1.5, **held}))

    def arm(name, load, dead=0.0):
        return {f"{name}/moe/heldout_load_max_over_mean": load, f"{name}/moe/heldout_load_max_over_mean_bias_zeroed": load,
                **{f"{name}/{k}": v for k, v in held.items()}, f"{name}/moe/heldout_dead_fraction": dead}
    instance.report_runless_asset_event(dg.AssetMaterialization(
        asset_key=key("smoke", "balancing_ablation"), tags={PROFILE_TAG: "smoke"},
        metadata={"path": dg.MetadataValue.path(str(tmp_path)), "sha256": "arm", "steps": 100,
                  "balanced": "quantile", **arm("quantile", 1.1), **arm("none", 1.9, dead=0.25),
                  "load_curves": dg.MetadataValue.json({"quantile": [[1, 1.4], [2, 1.2]], "none": [[1, 1.4], [2, 2.1]]})}))
    figs = report.gather(instance, "smoke")
    c2 = {c.number: c for c in report.judge(figs, None)}[2]
    assert c2.status == PASS, c2.line()  # 1.9 ≥ 1.5 × 1.1; the bias-zeroed 1.5 is no longer the without
    assert c2.figures["without"] == {"stage-1 arm none, 100 steps": 1.9}
    assert c2.figures["with"]["stage-1 arm quantile, 100 steps"] == 1.1 and c2.figures["with"]["stage 4"] == 1.4
    assert c2.figures["drift_against"] == {"stage-1 arm none, 100 steps": "stage-1 arm quantile, 100 steps"}
    assert "trained with none" in c2.figures["without_source"] and c2.checkpoints["balancing_ablation"] == "arm"
    assert c2.figures["dead_fraction"]["stage-1 arm none, 100 steps"] == 0.25
    assert figs["load_curves"]["balancing_ablation[none]"] == [(1, 1.4), (2, 2.1)]
    # The unbalanced arm barely drifting fails the claim, naming its twin.
    instance.report_runless_asset_event(dg.AssetMaterialization(
        asset_key=key("smoke", "balancing_ablation"), tags={PROFILE_TAG: "smoke"},
        metadata={"path": dg.MetadataValue.path(str(tmp_path)), "sha256": "arm2", "steps": 100,
                  "balanced": "quantile", **arm("quantile", 1.1), **arm("none", 1.3)}))
    c2 = {c.number: c for c in report.judge(report.gather(instance, "smoke"), None)}[2]
    assert c2.status == FAIL and "1.30 < 1.5× 1.10 (stage-1 arm quantile, 100 steps)" in c2.reason


@pytest.fixture
def k3_env(home, monkeypatch):
    # `k3 report` exports these; monkeypatch restores them after the test.
    for var in ("DAGSTER_HOME", "K3_PROFILE"):
        monkeypatch.setenv(var, "")
    monkeypatch.setenv("K3_HOME", str(home))


def test_k3_report_prints_where_and_every_claim(reported, k3_env, capsys):
    instance, _ = reported
    by, md = _claims(instance)
    assert main(["report", "--profile", "smoke", "--port", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"k3 report: {md['path']}"
    assert lines[1].startswith("k3 report: Page http://127.0.0.1:1/k3/report/smoke   Dagster "
                               "http://127.0.0.1:1/assets/smoke/report   MLflow "
                               f"http://127.0.0.1:1{md['mlflow_run']}")
    assert "no `k3 ui` answers there now" in lines[1]
    claim_lines = [line.strip() for line in lines if line.startswith("  claim ")]
    assert len(claim_lines) == 8 and claim_lines[7].startswith(f"claim 8 ✓ pass: {by[8]['figure']}")


def smoke_all_job():
    """The job `k3 run --profile smoke` runs a selection of (module level: `dg.reconstructable` needs it)."""
    from pipelines.definitions import defs
    return defs.resolve_job_def("smoke_all_job")


CLAIMS = {dg.AssetCheckKey(key("smoke", "report"), f"claim_{n}") for n in range(1, 9)}


@pytest.fixture(scope="module")
def k3_run_report(reported, home):
    """The id of a run of `k3 run --profile smoke --select report --force` on `reported`'s lineage.
    Claim 8 off (`--set report.kernelsuite=off`): the run's config goes to each of the four
    re-executions below, which judge the eight claims again, and claim 8's measurement is
    `reported`'s (test_the_report_reports_what_exists_and_marks_the_rest)."""
    env = {**os.environ, "K3_HOME": str(home)}
    env.pop("DAGSTER_HOME", None)
    cli = subprocess.run([str(Path(sys.executable).parent / "k3"), "run", "--profile", "smoke", "--select", "report",
                          "--force", "--set", "report.kernelsuite=off"], env=env, capture_output=True, text=True,
                         timeout=600)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    return re.findall(r"\(run ([0-9a-f-]{36})\)", cli.stdout)[-1]


def _judged_in(instance, run_id: str) -> set[str]:
    """The claims judged on the report that run `run_id` made, which must be the newest (the UI shows
    a check "Not Evaluated" when its newest evaluation targets an older materialization)."""
    assert instance.get_latest_materialization_event(key("smoke", "report")).run_id == run_id
    return {e.asset_check_evaluation.check_name
            for e in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)
            if e.asset_check_evaluation.target_materialization_data.run_id == run_id}


@pytest.mark.slow
def test_every_rerun_of_the_report_judges_the_claims(reported, k3_run_report, k3_env):
    """The report made by `k3 run`, re-executed through Dagster's Python API: its step alone, and all."""
    instance, _ = reported
    parent = instance.get_run_by_id(k3_run_report)
    # The UI re-executes a step selection with the run's check selection, a missing one sent as
    # none (Dagster 1.13's getReexecutionParamsForSelection): `k3 run` records it.
    assert parent.asset_selection == {key("smoke", "report")} and parent.asset_check_selection == CLAIMS
    assert _judged_in(instance, parent.run_id) == {c.name for c in CLAIMS}
    for steps in (["smoke__report"], None):  # "Re-execute selected steps", "Re-execute all"
        child = dg.execute_job(dg.reconstructable(smoke_all_job), instance, reexecution_options=dg.ReexecutionOptions(
            parent_run_id=parent.run_id, step_selection=steps))
        assert child.success
        assert _judged_in(instance, child.run_id) == {c.name for c in CLAIMS}

    # A run recorded without its checks (before `k3 run` recorded them): the UI's step re-execution
    # (check selection none) is refused with the checks named, never run without its claims.
    with pytest.raises(dg.DagsterInvalidSubsetError, match="claim_1"):
        smoke_all_job().get_subset(asset_selection={key("smoke", "report")}, asset_check_selection=set())


LAUNCH = """mutation($p: ExecutionParams!) { launchPipelineExecution(executionParams: $p) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
  ... on InvalidSubsetError { message } } }"""
REEXECUTE = """mutation($p: ReexecutionParams) { launchPipelineReexecution(reexecutionParams: $p) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }"""


@pytest.mark.slow
def test_the_uis_reruns_of_the_report_judge_the_claims(reported, k3_run_report, home, k3_env):
    """The two re-executions the Runs page offers, as the UI sends them to Dagster's GraphQL API (the
    workspace `k3 ui` serves, a code server and a run process each): the report's step, with the
    parameters the UI builds from the run, and "Re-execute all"."""
    from dagster._core.instance.ref import InstanceRef
    from dagster._core.test_utils import wait_for_runs_to_finish
    from dagster_graphql.test.utils import define_out_of_process_context, execute_dagster_graphql
    from pipelines.resources import REPO_ROOT

    instance, _ = reported
    parent = instance.get_run_by_id(k3_run_report)
    # Runs start at once: the instance's run queue is served by `k3 ui`'s daemon, not running here.
    ref = InstanceRef.from_dir(str(dagster_home(home)), overrides={"run_coordinator": {
        "module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"}})
    # getReexecutionParamsForSelection (Dagster 1.13's UI): the run's selections, the chosen steps.
    step_params = {"mode": "default", "runConfigData": parent.run_config, "stepKeys": ["smoke__report"],
                   "selector": {"repositoryLocationName": "k3", "repositoryName": "__repository__",
                                "pipelineName": parent.job_name,
                                "assetSelection": [{"path": k.path} for k in parent.asset_selection],
                                "assetCheckSelection": [{"assetKey": {"path": c.asset_key.path}, "name": c.name}
                                                        for c in parent.asset_check_selection or ()]},
                   "executionMetadata": {"parentRunId": parent.run_id, "rootRunId": parent.run_id,
                                         "tags": [{"key": "dagster/step_selection", "value": "smoke__report"}]}}
    with dg.DagsterInstance.from_ref(ref) as ui_instance, \
            define_out_of_process_context(str(REPO_ROOT / "workspace.yaml"), None, ui_instance) as context:
        for query, params in ((LAUNCH, step_params), (REEXECUTE, {"parentRunId": parent.run_id, "strategy": "ALL_STEPS"})):
            [launched] = execute_dagster_graphql(context, query, {"p": params}).data.values()
            assert launched["__typename"] == "LaunchRunSuccess", launched
            child = launched["run"]["runId"]
            wait_for_runs_to_finish(ui_instance, timeout=300)
            assert ui_instance.get_run_by_id(child).status == dg.DagsterRunStatus.SUCCESS
            assert _judged_in(ui_instance, child) == {c.name for c in CLAIMS}


def test_k3_report_without_a_report_names_the_command(tmp_path, monkeypatch, capsys):
    for var in ("DAGSTER_HOME", "K3_PROFILE"):
        monkeypatch.setenv(var, "")
    monkeypatch.setenv("K3_HOME", str(tmp_path / "empty"))
    assert main(["report", "--profile", "smoke"]) == 1
    out = capsys.readouterr().out
    assert "no report yet for profile smoke: `k3 run --profile smoke --select report` makes one" in out


def test_a_report_of_nothing_says_so(smoke_resources):
    """No asset of the lineage materialized (and claim 8 off): every claim not measured, no plot
    drawn, and still the files, the page and the eight checks."""
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize(REPORT, instance=instance, resources=smoke_resources,
                            run_config={"ops": {"smoke__report": {"config": {"kernelsuite": "off"}}}})
    assert result.success
    md = {k: v.value for k, v in result.asset_materializations_for_node("smoke__report")[0].metadata.items()}
    assert md["claims/not_measured"] == 8 and not any(v.startswith("![") for k, v in md.items() if k.startswith("plot/"))
    html = (Path(md["path"]).parent / "report.html").read_text()
    assert "data:image" not in html and html.count("not measured: ") >= 8
    assert len(result.get_asset_check_evaluations()) == 8


def test_report_config_is_checked(smoke_resources):
    with dg.build_asset_context(resources=smoke_resources, instance=dg.DagsterInstance.ephemeral()) as ctx, \
            pytest.raises(dg.Failure, match="config.kernelsuite = 'some'"):
        REPORT[0](ctx, report.ReportConfig(kernelsuite="some"))


def test_the_page_is_what_the_webserver_serves(reported):
    """`k3 ui`'s /k3/report/<profile>[/<run id>] (pipelines/webserver.py): the newest report's page, or a
    given run's, and a message naming the command where there is none."""
    from pipelines.webserver import report_html
    instance, result = reported
    _, md = _claims(instance)
    newest, _ = report_html(instance, "smoke", None)
    assert newest == Path(md["path"]).parent / "report.html"
    mine, _ = report_html(instance, "smoke", result.run_id)
    assert mine.parent.name == result.run_id and mine.read_text().startswith("<!doctype html>")
    missing, why = report_html(instance, "tiny", None)
    assert missing is None and "`k3 run --profile tiny --select report` makes one" in why
    missing, why = report_html(instance, "smoke", "no-such-run")
    assert missing is None and "in run no-such-run" in why


def test_claims_json_beside_the_report(reported):
    _, md = _claims(reported[0])
    saved = json.loads((Path(md["path"]).parent / "claims.json").read_text())
    assert [c["number"] for c in saved] == list(range(1, 9)) and "figures" in saved[0]


def test_every_asset_it_reads_is_in_the_definitions():
    """A name in report.SOURCES that no builder makes would be a dangling key in the graph."""
    from pipelines.definitions import defs
    graph = defs.resolve_asset_graph()
    assert {key("smoke", n) for n in report.upstream_names()} <= graph.materializable_asset_keys


def test_clue_counts_prefer_checkpoint_evals_of_the_same_checkpoint(tmp_path):
    """Stage 1 re-scored by checkpoint_evals (4 pairs per cell in the grid) is read from there; stage
    2, whose re-scoring was of an older checkpoint, from its end-of-stage eval (1 pair per cell)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    grid = tmp_path / "clue_eval.parquet"
    cells = [(64, 0, 32), (512, 0, 32), (512, 256, 512)]
    pq.write_table(pa.table({"length_target": [c[0] for c in cells for _ in range(4)],
                             "bucket_lo": [c[1] for c in cells for _ in range(4)],
                             "bucket_hi": [c[2] for c in cells for _ in range(4)],
                             "pair_id": [f"{c}-{i}" for c in cells for i in range(4)]}), grid)
    instance = dg.DagsterInstance.ephemeral()

    def put(name, metadata, version="", **tags):
        instance.report_runless_asset_event(dg.AssetMaterialization(
            asset_key=key("smoke", name), metadata={"path": dg.MetadataValue.path(str(tmp_path / name)), **metadata},
            tags={PROFILE_TAG: "smoke", **({"dagster/data_version": version} if version else {}), **tags}))
    put("clue_data", {"path": dg.MetadataValue.path(str(grid))})
    end_of_stage = {"eval/clue_acc/scattered/d0-32": 0.5, "eval/clue_acc/scattered/len64/d0-32": 0.0,
                    "eval/clue_acc/scattered/len512/d0-32": 1.0}
    for s in (1, 2):
        put(f"pretrain_stage_{s}", {"eval": dg.MetadataValue.json(end_of_stage)}, version=f"v{s}")
    whole = {"eval/clue_acc/scattered/d0-32": 0.375, "eval/clue_acc/scattered/len64/d0-32": 0.25,
             "eval/clue_acc/scattered/len512/d0-32": 0.5, "eval/clue_acc/scattered/d256-512": 0.75,
             "eval/clue_acc/scattered/len512/d256-512": 0.75}
    put("checkpoint_evals", {"evals": dg.MetadataValue.json({"pretrain_stage_1": whole, "pretrain_stage_2": whole})},
        **{"dagster/input_data_version/smoke/pretrain_stage_1": "v1",
           "dagster/input_data_version/smoke/pretrain_stage_2": "an older stage 2"})
    stages = report.gather(instance, "smoke")["stages"]
    assert stages[1]["counts_how"].startswith("checkpoint_evals")
    assert stages[1]["counts"]["scattered"] == {"0-32": (3.0, 8), "256-512": (3.0, 4)}
    assert stages[2]["counts_how"].startswith("end-of-stage eval")
    assert stages[2]["counts"]["scattered"] == {"0-32": (1.0, 2)}
    # An accuracy that is no whole number of hits of its n: the estimate is wrong, the counts left out.
    counts, how = report._clue_counts({"eval/clue_acc/scattered/d0-32": 0.3,
                                       "eval/clue_acc/scattered/len64/d0-32": 0.3}, 4, {})
    assert counts == {} and how.startswith("counts unknown")
    # A profile that scores its whole grid (per_cell None) records counts: without them, no guess.
    ev = {"eval/clue_acc/scattered/d0-32": 0.5, "eval/clue_acc/scattered/len64/d0-32": 0.5}
    counts, how = report._clue_counts(ev, None, {(64, "0-32"): 16})
    assert counts == {} and how.startswith("counts unknown")
    counts, _ = report._clue_counts({**ev, "eval/clue_n/scattered/d0-32": 96.0}, None, {})
    assert counts == {"scattered": {"0-32": (48.0, 96)}}
