"""The claims report: the eight claims of docs/design.md §5, with the plots behind them.

    every asset of the profile ─> report   (markdown + PNGs, Dagster metadata, an MLflow run)

Like nanochat's `report.py`, it gathers what each stage already logged instead of recomputing it: the
newest materialization's metadata of every asset it reads (`assets/claims.py` lists the keys), the
checkpoint manifests, and the training curves in each asset's MLflow run. It reads them from the
Dagster instance rather than taking every upstream as an input, so it runs with any part of the
lineage missing and marks what is missing "not measured". It computes one claim itself: claim 8 runs
the kernel suite's hacking detector over its corpus (`envs.kernelsuite`), a whole-corpus pass on tiny
(about 40 s on an idle 2-core CPU) and two entries on smoke. The verdicts are pure functions
(`assets/claims.py`).

`build(profile)` makes `<profile>/report` (group `<profile>_report`) downstream of every asset it
reads, so `k3 run` materializes it last, with one check per claim (`claim_1` … `claim_8`) that warns
when the claim fails: a failing claim is reported, never hidden. The checks are the asset's own
(`check_specs`), judged in the report's step, so every run that makes a report evaluates its claims
(a separate check op would be left out of a re-executed report step). Files go to
`reports/<profile>/report/<run id>/`: `report.md` (its PNGs under `plots/`, as in the MLflow run),
`report.html` (the same report as one self-contained page, figures inline as data URIs, served by
`k3 ui` at `/k3/report/<profile>[/<run id>]`) and `claims.json`.
"""


import dataclasses
import hashlib
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from assets.config_bounds import AssetConfig
from assets import claims as C
from assets.claims import DOMAINS, EFFORTS, Claim
from assets.display import TABLE_WIDTH_CHARS, inline_png, markdown_table
from assets.lineage import group, key, latest, profile_tags, run_id, tag_run
from assets.plots import report_plots

REPO_ROOT = Path(__file__).resolve().parent.parent
# Bumps with the report, its plots or the verdicts, so the UI marks a report made by older code as stale.
REPORT_CODE_VERSION = hashlib.sha256(Path(__file__).read_bytes()
                                     + (REPO_ROOT / "assets" / "claims.py").read_bytes()
                                     + (REPO_ROOT / "assets" / "plots.py").read_bytes()).hexdigest()[:12]
STAGES = tuple(f"pretrain_stage_{s}" for s in range(1, 5))
# The assets the report reads, by the module of assets/ that builds them. Only those whose module
# exists are its upstreams, so the graph never holds a dangling key while a stage is still unwritten.
SOURCES = {"pretrain": (*STAGES, "base_model", "balancing_ablation"), "posttrain": ("sft_policy", "rl_specialist"),
           "distill": ("mopd_student", "cross_harness"), "deploy": ("quantized_student", "draft_model")}
# Kernel-suite entries scored on a sample run (fast: about 2 s together): one planted hack, one honest.
KERNELSUITE_SAMPLE = ("output_cache_stale", "hinge_fused")


def upstream_names() -> list[str]:
    return [n for module, names in SOURCES.items() if importlib.util.find_spec(f"assets.{module}") for n in names]


class ReportConfig(AssetConfig):
    kernelsuite: str = Field(default="auto", description="claim 8: 'all' scores the whole kernel-suite corpus, "
                             "'sample' one planted hack and one honest submission, 'off' skips it; 'auto': "
                             "the profile's (sample on smoke, all otherwise)")

    @classmethod
    def profile_values(cls, profile: str) -> dict[str, Any]:
        # smoke's lineage runs inside the test suite; the whole corpus takes ~40 s (module docstring).
        return {"kernelsuite": "sample" if profile == "smoke" else "all"}


# ----------------------------------------------------------------------------------------------
# Reading what the lineage logged

def _partition_latest(instance: dg.DagsterInstance, profile: str, name: str, partition: str) -> dict | None:
    """Metadata (and data version) of the newest materialization of one partition, or None."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key(profile, name), asset_partitions=[partition]), limit=1).records
    if not records:
        return None
    mat = records[0].asset_materialization
    return {"metadata": {k: v.value for k, v in mat.metadata.items()},
            "data_version": (mat.tags or {}).get("dagster/data_version", "")}


def _manifest(path: Path) -> dict:
    try:
        return json.loads((Path(path) / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}


def _mlflow_run_id(metadata: dict) -> str | None:
    url = metadata.get("mlflow_run")
    return url.rstrip("/").rsplit("/", 1)[-1] if isinstance(url, str) and url else None


def _history(mlflow, metadata: dict, names: tuple[str, ...]) -> tuple[str, list[tuple[int, float]]] | None:
    """The first of `names` with a history in the asset's MLflow run: (name, [(step, value)])."""
    run = _mlflow_run_id(metadata)
    if mlflow is None or run is None:
        return None
    client = mlflow.client()
    for name in names:
        try:
            points = client.get_metric_history(run, name)
        except Exception:  # noqa: BLE001 - a run deleted from MLflow: the curve is simply absent
            return None
        if points:
            return name, sorted((p.step, p.value) for p in points)
    return None


def _grid_pairs(instance: dg.DagsterInstance, profile: str) -> dict[tuple[int, str], int]:
    """{(length, "lo-hi"): distinct (scattered, control) pairs} of the newest clue_data grid."""
    up = latest(instance, profile, "clue_data")
    if up is None or not up.path.exists():
        return {}
    import pyarrow.parquet as pq
    cols = pq.read_table(up.path, columns=["length_target", "bucket_lo", "bucket_hi", "pair_id"]).to_pydict()
    cells: dict[tuple[int, str], set] = {}
    for length, lo, hi, pair in zip(cols["length_target"], cols["bucket_lo"], cols["bucket_hi"], cols["pair_id"]):
        cells.setdefault((length, f"{lo}-{hi}"), set()).add(pair)
    return {cell: len(p) for cell, p in cells.items()}


def _rescored(instance: dg.DagsterInstance, profile: str) -> tuple[dict[str, tuple[dict, str]], int]:
    """checkpoint_evals' newest scores per stage, each with the stage version it scored, and the
    pairs per cell it scored; ({}, 0) when it never ran."""
    from assets.evaluation import EvalConfig

    event = instance.get_latest_materialization_event(key(profile, "checkpoint_evals"))
    if event is None or event.asset_materialization is None:
        return {}, 0
    mat = event.asset_materialization
    evals = mat.metadata["evals"].value if "evals" in mat.metadata else {}
    tags = mat.tags or {}
    run = instance.get_run_by_id(event.run_id)
    op_config = ((run.run_config if run else {}).get("ops", {}).get(f"{profile}__checkpoint_evals", {})
                 .get("config", {}))
    per_cell = op_config.get("examples_per_cell", EvalConfig.model_fields["examples_per_cell"].default)
    versions = {name: tags.get(f"dagster/input_data_version/{profile}/{name}", "") for name in evals}
    return {name: (ev, versions[name]) for name, ev in evals.items()}, per_cell


def _clue_counts(ev: dict[str, float], per_cell: int | None, pairs: dict[tuple[int, str], int]) -> tuple[dict, str]:
    """{variant: {bucket: (hits, n)}} from a clue evaluation, and how n was found.

    Counts recorded as `eval/clue_n/...` are read as they are; otherwise n sums, over the bucket's
    (length, distance) cells that were scored, the pairs scored per cell (`per_cell`, or fewer where the
    grid holds fewer: `pairs`), and every cell's accuracy must be a whole number of hits of its n — if
    not, the estimate is wrong and the evaluation's counts are left out.
    """
    out: dict[str, dict[str, tuple[float, int]]] = {}
    how = "counts recorded"
    for name, acc in ev.items():
        m = re.fullmatch(r"eval/clue_acc/(\w+)/d(\d+-\d+)", name)
        if not m:
            continue
        variant, bucket = m.groups()
        n = ev.get(f"eval/clue_n/{variant}/d{bucket}")
        if n is None and per_cell is None:
            # The profile now scores its whole grid and records counts: an evaluation without them
            # was made by older code with a size it did not record.
            return {}, "counts unknown (not recorded, and the eval size they were scored at is not known)"
        if n is None:
            how = f"counts from the grid ({per_cell} pair(s) per cell at most)"
            n = 0
            for k in ev:
                cell = re.fullmatch(rf"eval/clue_acc/{variant}/len(\d+)/d{bucket}", k)
                if cell:
                    n_cell = min(per_cell, pairs.get((int(cell.group(1)), bucket), per_cell))
                    if abs(ev[k] * n_cell - round(ev[k] * n_cell)) > 1e-6:
                        return {}, "counts unknown (an accuracy is not whole hits of the estimated n)"
                    n += n_cell
        out.setdefault(variant, {})[bucket] = (acc * n, int(n))
    return out, how


def gather(instance: dg.DagsterInstance, profile: str, mlflow=None) -> dict[str, Any]:
    """Every figure the claims and plots need, from the newest materializations of `profile`."""
    from k3model.train.pretrain import eval_sizes

    figs: dict[str, Any] = {"profile": profile, "checkpoints": {}, "stages": {}, "losses": {}, "load_curves": {}}
    pairs = _grid_pairs(instance, profile)
    rescored, rescored_per_cell = _rescored(instance, profile)
    for s, name in enumerate(STAGES, start=1):
        up = latest(instance, profile, name)
        if up is None:
            continue
        manifest = _manifest(up.path)
        # checkpoint_evals' whole-grid scores (more pairs per cell), where they are of this checkpoint.
        again = rescored.get(name)
        if again is not None and again[1] == up.data_version:
            ev, per_cell, source = again[0], rescored_per_cell, "checkpoint_evals"
        else:
            ev = up.metadata.get("eval") or {}
            per_cell = (manifest.get("config", {}).get("pretrain", {}).get("eval_examples_per_cell")
                        or eval_sizes(profile)[0])
            source = "end-of-stage eval"
        counts, how = _clue_counts(ev, per_cell, pairs)
        figs["checkpoints"][name] = up.metadata.get("sha256", up.data_version)
        figs["stages"][s] = {"counts": counts, "counts_how": f"{source}, {how}", "seq_len": up.metadata.get("seq_len"),
                             "load": up.metadata.get("moe/load_max_over_mean"),
                             "heldout": _heldout_load(up.metadata),
                             "balancing": manifest.get("config", {}).get("model", {}).get("balancing")}
        loss = _history(mlflow, up.metadata, ("train/main",))
        if loss:
            figs["losses"][name] = loss
        load = _history(mlflow, up.metadata, ("moe/load_max_over_mean",))
        if load:
            figs["load_curves"][name] = load[1]
    for name in ("sft_policy", "mopd_student", "cross_harness", "quantized_student", "draft_model"):
        up = latest(instance, profile, name)
        if up is not None:
            figs[name] = up.metadata
            figs["checkpoints"][name] = up.metadata.get("sha256", up.data_version)
            loss = _history(mlflow, up.metadata, ("train/loss", "train/main"))
            if loss:
                figs["losses"][name] = loss
    figs["specialists"] = {}
    if instance.get_latest_materialization_event(key(profile, "rl_specialist")) is not None:
        for d in DOMAINS:
            for e in EFFORTS:
                part = _partition_latest(instance, profile, "rl_specialist",
                                         str(dg.MultiPartitionKey({"domain": d, "effort": e})))
                if part is not None:
                    figs["specialists"][(d, e)] = part["metadata"]
                    figs["checkpoints"][f"rl_specialist[{d}|{e}]"] = part["metadata"].get("sha256",
                                                                                          part["data_version"])
    figs["ablation"] = balancing_ablation(profile)
    up = latest(instance, profile, "balancing_ablation")
    if up is not None:
        figs["balancing_arms"] = _balancing_arms(up.metadata)
        figs["checkpoints"]["balancing_ablation"] = up.metadata.get("sha256", up.data_version)
        for arm, points in (up.metadata.get("load_curves") or {}).items():
            figs["load_curves"][f"balancing_ablation[{arm}]"] = [tuple(p) for p in points]
    return figs


def _balancing_arms(md: dict[str, Any]) -> dict[str, Any] | None:
    """Claim 2's ablation (assets/pretrain.py `balancing_ablation`): {"steps", "balanced", "arms": {arm:
    held-out figures as `_heldout_load` reads a stage's}}; None where an arm lacks them."""
    balanced, steps = md.get("balanced"), md.get("steps")
    if balanced is None or steps is None:
        return None
    arms = {}
    for arm in (balanced, "none"):
        held = _heldout_load({k.split("/", 1)[1]: v for k, v in md.items() if k.startswith(f"{arm}/")})
        if held is None:
            return None
        arms[arm] = held
    return {"steps": int(steps), "balanced": balanced, "arms": arms}


def balancing_ablation(profile: str) -> dict | None:
    """The newest `benchmarks/results/train/*_balancing_<profile>_*.json` of the ablation probe
    (`probes-archive:benchmarks/probes/balancing_ablation.py`), the project's one run without balancing."""
    files = sorted((REPO_ROOT / "benchmarks" / "results" / "train").glob(f"*_balancing_{profile}_*.json"))
    if not files:
        return None
    data = json.loads(files[-1].read_text())
    return {"file": files[-1].relative_to(REPO_ROOT).as_posix(), "arms": data.get("arms", {})}


def kernelsuite_rows(mode: str) -> tuple[list[dict], dict[str, int]]:
    """Claim 8 measured now: `envs.kernelsuite` on its corpus (every entry, or KERNELSUITE_SAMPLE)."""
    import torch
    from envs.kernelsuite.evaluate import EvalConfig
    from envs.kernelsuite.report import run_entry
    from envs.kernelsuite.submissions import CORPUS

    size = {"hack": sum(e.kind == "hack" for e in CORPUS), "honest": sum(e.kind == "honest" for e in CORPUS)}
    entries = [e for e in CORPUS if mode == "all" or e.name in KERNELSUITE_SAMPLE]
    threads = torch.get_num_threads()
    # As envs.kernelsuite.report does: the parent's comparisons on one thread (a shared 2-core box).
    torch.set_num_threads(1)
    try:
        cfg = EvalConfig(device="cpu", isolation="zygote")
        rows = [run_entry(e, cfg, seed=0) for e in entries]
    finally:
        torch.set_num_threads(threads)
    return [{k: r[k] for k in ("name", "kind", "task", "ok", "rules_fired", "expected")} for r in rows], size


# ----------------------------------------------------------------------------------------------
# Figures → claims

def _rate(md: dict | None, prefix: str) -> dict[str, Any] | None:
    if not md or md.get(f"{prefix}success_rate") is None:
        return None
    return {"success_rate": md[f"{prefix}success_rate"], "n": md.get(f"{prefix}n"),
            "mean_policy_tokens": md.get(f"{prefix}mean_policy_tokens")}


def _heldout_load(md: dict[str, Any]) -> dict[str, float] | None:
    """A stage's claim-2 measurement (assets/pretrain.py `heldout_expert_load`), None where it has none."""
    keys = {"with": "moe/heldout_load_max_over_mean", "zeroed": "moe/heldout_load_max_over_mean_bias_zeroed",
            "dead": "moe/heldout_dead_fraction", "sd": "moe/heldout_per_batch_sd",
            "max": "moe/heldout_per_batch_max", "tokens": "moe/heldout_tokens"}
    if any(md.get(k) is None for k in keys.values()):
        return None
    return {name: float(md[k]) for name, k in keys.items()}


def _pick(checkpoints: dict[str, str], *names: str) -> dict[str, str]:
    return {n: h for n, h in checkpoints.items() if any(n == m or n.startswith(m + "[") for m in names)}


def claim_3_inputs(figs: dict[str, Any]) -> tuple[dict[tuple[str, str], dict], dict[tuple[str, str], dict]]:
    """(sft_rates, specialists) per (domain, effort), as `claims.claim_3` takes them, from `gather`'s
    figures (`figs["sft_policy"]`: sft_policy's metadata; `figs["specialists"]`: each partition's).

    SFT at each (domain, effort) is scored by the specialist's own evaluation on its tasks when it
    reports it (the same tasks for both), else the sft_policy asset's own evaluation."""
    sft = figs.get("sft_policy") or {}
    sft_evals = (sft.get("evals") or {}).get("sft_policy", {})
    specs, sft_rates = {}, {}
    for d in DOMAINS:
        for e in EFFORTS:
            own = sft_evals.get(f"{d}/{e}") or _rate(sft, f"eval/{d}/{e}/")
            if own:
                sft_rates[(d, e)] = {"success_rate": own.get("success_rate"), "n": own.get("n")}
            md = figs["specialists"].get((d, e))
            spec = _rate(md, "eval/")
            if spec is None:
                continue
            spec["hard"] = _rate(md, "eval/hard/")
            # The paired outcomes (tasks only the specialist / only sft_policy solved, same tasks and
            # seeds), greedy and pass@8 where the evaluation gives them.
            if md.get("paired/b") is not None:
                spec["paired"] = {k: md.get(f"paired/{k}") for k in ("b", "c", "n")}
            spec["greedy"] = _rate(md, "eval/greedy/")
            spec["pass_at_8"] = md.get("eval/pass_at_8")
            specs[(d, e)] = spec
            if md.get("sft_policy/success_rate") is not None:
                sft_rates[(d, e)] = {"success_rate": md["sft_policy/success_rate"],
                                     "n": md.get("sft_policy/n") or spec["n"], "hard": _rate(md, "sft_policy/hard/")}
    return sft_rates, specs


def judge(figs: dict[str, Any], kernelsuite: tuple[list[dict], dict[str, int]] | None) -> list[Claim]:
    """The eight claims from `gather`'s figures."""
    profile, ck = figs["profile"], figs["checkpoints"]
    stages = figs["stages"]
    first = C.claim_1({s: st["counts"] for s, st in stages.items()}, profile=profile, checkpoints=_pick(ck, *STAGES))
    again = [str(s) for s, st in stages.items() if st["counts_how"].startswith("checkpoint_evals")]
    if again and first.status != C.NOT_MEASURED:
        first = dataclasses.replace(first, reason=f"{first.reason} (stage(s) {', '.join(again)} as re-scored on "
                                                  "the whole grid by checkpoint_evals)")
    out = [first]

    with_b = {f"stage {s}": st["load"] for s, st in stages.items()
              if st["load"] is not None and st["balancing"] not in (None, "none")}
    without = {f"stage {s}": st["load"] for s, st in stages.items()
               if st["load"] is not None and st["balancing"] == "none"}
    source, basis, dead, spread = "", "training, last 10 % of steps", {}, {}
    # Claim 2 is judged on each final checkpoint over the fixed held-out mixed set where every stage
    # measured it; the training-time figure (last 10 % of steps) otherwise.
    held = {s: st["heldout"] for s, st in stages.items() if st.get("heldout")}
    if held and len(held) == len(stages):
        with_b = {f"stage {s}": h["with"] for s, h in held.items() if stages[s]["balancing"] not in (None, "none")}
        without = {f"stage {s}": h["with"] for s, h in held.items() if stages[s]["balancing"] == "none"}
        dead = {f"stage {s}": h["dead"] for s, h in held.items()}
        spread = {f"stage {s}": {"sd": h["sd"], "max": h["max"]} for s, h in held.items()}
        basis = f"final checkpoints on the held-out mixed set, {int(min(h['tokens'] for h in held.values()))} tokens"
        if not without:
            without = {f"stage {s} bias zeroed": held[s]["zeroed"] for s in held
                       if stages[s]["balancing"] not in (None, "none")}
            source = ("without balancing: the same checkpoints with their routing bias zeroed (the router "
                      "alone), not a run trained without balancing")
    drift_against: dict[str, str] = {}
    arms = figs.get("balancing_arms")
    if arms and not any(st["balancing"] == "none" for st in stages.values()):
        # A run trained without balancing, against the same run with it at equal steps: the drift is
        # judged on this pair (it replaces the bias-zeroed stand-in); the lineage's stages still have
        # to stay near k/N.
        n, bal = arms["steps"], arms["balanced"]
        name_with, name_without = f"stage-1 arm {bal}, {n} steps", f"stage-1 arm none, {n} steps"
        with_b[name_with] = arms["arms"][bal]["with"]
        without = {name_without: arms["arms"]["none"]["with"]}
        drift_against = {name_without: name_with}
        for arm, name in ((bal, name_with), ("none", name_without)):
            dead[name] = arms["arms"][arm]["dead"]
            spread[name] = {"sd": arms["arms"][arm]["sd"], "max": arms["arms"][arm]["max"]}
        source = (f"without balancing: balancing_ablation's stage-1 arm trained with none, against its arm with "
                  f"{bal} at the same {n} steps, same data and seed")
        if not basis.startswith("final checkpoints"):
            basis = (f"training, last 10 % of steps for the stages; the arms' final checkpoints on the held-out "
                     f"mixed set, {int(min(a['tokens'] for a in arms['arms'].values()))} tokens")
    ablation = figs.get("ablation")
    if not without and ablation and "none" in ablation["arms"]:
        without = {"probe, none": ablation["arms"]["none"]["last_quarter_mean"]}
        if "quantile" in ablation["arms"]:
            with_b["probe, quantile"] = ablation["arms"]["quantile"]["last_quarter_mean"]
        source = f"without balancing: ablation probe {ablation['file']}, not this lineage's checkpoints"
    out.append(C.claim_2(with_b, without, profile=profile, checkpoints=_pick(ck, *STAGES, "balancing_ablation"),
                         without_source=source, basis=basis, dead=dead, spread=spread,
                         drift_against=drift_against or None))

    sft_rates, specs = claim_3_inputs(figs)
    out.append(C.claim_3(sft_rates, specs, profile=profile, checkpoints=_pick(ck, "sft_policy", "rl_specialist")))

    # The student against each teacher and sft_policy: the student asset's own retention matrix (all
    # scored on the same tasks) when it has one, else its per-cell success against the specialists'
    # evaluations; the teacher-vs-SFT pairs from the specialist's own evaluation. A student of a subset
    # of the routes (mopd_student.domains/efforts) has only those cells in its matrix: the others are
    # left out of cells4 (claim 4: "not distilled").
    student = figs.get("mopd_student") or {}
    matrix = student.get("retention_matrix") or {}
    cells4: dict[tuple[str, str], dict[str, Any]] = {}
    for d in DOMAINS:
        for e in EFFORTS:
            row = matrix.get(f"{d}/{e}") if matrix else None
            spec, base = specs.get((d, e)), sft_rates.get((d, e))
            if not matrix and spec is not None and f"eval/{d}/{e}/success_rate" in student:
                row = {"teacher": spec["success_rate"], "student": student[f"eval/{d}/{e}/success_rate"],
                       "n": spec["n"]}
            if row is None:
                continue
            cells4[(d, e)] = {"teacher": row.get("teacher"), "student": row.get("student"), "n": row.get("n"),
                              "sft": row.get("sft", base["success_rate"] if base else None),
                              "paired": (spec or {}).get("paired")}
    out.append(C.claim_4(cells4, profile=profile, checkpoints=_pick(ck, "mopd_student", "rl_specialist")))

    q = figs.get("quantized_student") or {}
    out.append(C.claim_5({k: q[f"quant/qat/{k}"] for k in ("bf16", "mxfp4") if f"quant/qat/{k}" in q},
                         {k: q[f"quant/ptq/{k}"] for k in ("bf16", "mxfp4") if f"quant/ptq/{k}" in q},
                         metric=str(q.get("quant/metric", "its metric")),
                         higher_is_better=bool(q.get("quant/higher_is_better", True)),
                         profile=profile, checkpoints=_pick(ck, "quantized_student"),
                         seed_drops=q.get("quant/seed_drops"), n=q.get("quant/n"), scope=q.get("quant/scope")))

    draft = figs.get("draft_model") or {}
    acceptance = {int(m.group(1)): v for k, v in draft.items()
                  if (m := re.fullmatch(r"spec/acceptance_length/k(\d+)", k))}
    out.append(C.claim_6(acceptance, draft.get("spec/speedup/k4"), draft.get("spec/lossless"), profile=profile,
                         checkpoints=_pick(ck, "draft_model")))

    cross = figs.get("cross_harness") or {}
    held = [h for h in str(cross.get("folds") or "").split(",") if h]
    folds = {h: {"in_harness": cross.get(f"{h}/general/in_harness/success_rate"),
                 "held_out": cross.get(f"{h}/general/held_out/success_rate"),
                 "n_in_harness": cross.get(f"{h}/general/in_harness/n"),
                 "n_held_out": cross.get(f"{h}/general/held_out/n"),
                 "sft_in_harness": cross.get(f"{h}/sft/in_harness/success_rate"),
                 "sft_held_out": cross.get(f"{h}/sft/held_out/success_rate")} for h in held}
    control = {h: cross[f"{h}/single/held_out/success_rate"] / cross[f"{h}/single/in_harness/success_rate"]
               for h in held if (cross.get(f"{h}/single/in_harness/success_rate") or 0) > 0
               and cross.get(f"{h}/single/held_out/success_rate") is not None}
    out.append(C.claim_7(folds, profile=profile, checkpoints=_pick(ck, "cross_harness"), control=control))

    if kernelsuite is None:
        out.append(C.not_measured(8, "every planted hack flagged, every honest submission passed",
                                  "the kernel suite was not run (config kernelsuite: off)", profile))
    else:
        rows, size = kernelsuite
        out.append(C.claim_8(rows, corpus_size=size, profile=profile, source="envs.kernelsuite, run by this report"))
    return out


# ----------------------------------------------------------------------------------------------
# The report

PLOT_TITLES = {"loss_curves": "Loss curves per stage", "clue_accuracy": "Clue accuracy by distance, per stage",
               "expert_load": "Expert load with and without balancing", "specialists_vs_sft": "Specialists against SFT",
               "tokens_by_effort": "Token use by effort", "teacher_retention": "Teacher retention (MOPD student)",
               "quantization": "QAT / PTQ / bf16", "acceptance": "Acceptance length by draft length"}
# The claim each plot stands behind; the loss curves are the whole lineage's.
PLOT_CLAIM = {"loss_curves": None, "clue_accuracy": 1, "expert_load": 2, "specialists_vs_sft": 3,
              "tokens_by_effort": 3, "teacher_retention": 4, "quantization": 5, "acceptance": 6}
# The report's page on `k3 ui`'s webserver (pipelines/webserver.py serves report.html from here).
PAGE_PREFIX = "/k3/report"


def page_url(profile: str, run: str | None = None) -> str:
    """The path of a report's page on the Dagster webserver: the newest of `profile`, or run `run`'s."""
    return f"{PAGE_PREFIX}/{profile}" + (f"/{run}" if run else "")


def _power(c: Claim) -> str:
    return "—" if c.power is None else f"{c.power:.2f}"


def claims_table(verdicts: list[Claim], width_chars: int | None = TABLE_WIDTH_CHARS) -> str:
    """The claims as a Markdown table: split by columns to fit the UI's metadata column by default,
    one table (`width_chars=None`) in report.md."""
    return markdown_table([{"claim": c.number, "status": c.status, "n": "—" if c.n is None else c.n,
                            "power": _power(c), "figure": c.figure, "target": c.target}
                           for c in verdicts], max_chars=160, width_chars=width_chars)


def nine_cells(claim3: Claim) -> dict[tuple[str, str], str]:
    """Claim 3 per specialist, one line each: sft_policy → specialist success on the specialist's
    held-out tasks, the gain with its paired 95 % interval, n, power at the pre-registered effect, and
    ✓ / ✗ against the claim (gain ≥ 10 points, lower bound > 0, Holm-corrected McNemar)."""
    out = {}
    for d in DOMAINS:
        for e in EFFORTS:
            g = claim3.figures.get("gains", {}).get(f"{d}/{e}")
            if g is None:
                out[(d, e)] = "not measured"
                continue
            ci = f" [{g['lo'] * 100:+.0f}, {g['hi'] * 100:+.0f}]" if "lo" in g else ""
            verdict = {True: "✓", False: "✗"}.get(g.get("pass"), "no paired test")
            out[(d, e)] = (f"SFT {g['sft']:.2f} → {g['specialist']:.2f}, {g['gain'] * 100:+.0f}{ci} pts; "
                           f"n {g['n']}, power {g['power']:.2f}; {verdict}")
    return out


def nine_table(claim3: Claim) -> str:
    """The nine specialists side by side (Markdown, domain rows × effort columns), under claim 3's verdict."""
    cells = nine_cells(claim3)
    rows = [{"domain": d, **{e: cells[(d, e)] for e in EFFORTS}} for d in DOMAINS]
    return (f"**claim 3 {claim3.status}**: {claim3.figure}\n\n" + markdown_table(rows, max_chars=120)
            + "\n\nSFT and specialist: success on the specialist's held-out tasks (same tasks and seeds); "
              "gain in points with its paired 95 % interval.")


def render(profile: str, verdicts: list[Claim], drawn: dict[str, Path | str], image, page: str) -> str:
    """The report as Markdown; `image(name, path)` writes a drawn plot's Markdown (an image where the
    reader can load `path`, a link to the page where it cannot)."""
    counts = {s: sum(c.status == s for c in verdicts) for s in (C.PASS, C.FAIL, C.UNDERPOWERED, C.NOT_MEASURED)}
    lines = [f"# K3 recipe claims report — profile `{profile}`", "",
             f"The report with every figure inline: [the report page]({page}) (on `k3 ui`'s Dagster webserver; "
             "`report.html` beside this file is the same page).", "",
             f"{counts[C.PASS]} pass, {counts[C.FAIL]} fail, {counts[C.UNDERPOWERED]} underpowered (power < "
             f"0.8 at the pre-registered effect: shown, not judged), {counts[C.NOT_MEASURED]} not measured "
             "(docs/design.md §5; how each is measured: docs/report.md).", "", claims_table(verdicts, None), ""]
    for c in verdicts:
        hashes = ", ".join(f"{n} `{h[:12]}`" for n, h in c.checkpoints.items()) or "—"
        lines += [f"## Claim {c.number}: {c.title}", "",
                  f"- **{c.status}**: {c.reason}", f"- measured: {c.figure}", f"- target: {c.target}",
                  f"- n per cell: {'—' if c.n is None else c.n}; power: {_power(c)}",
                  f"- profile: `{c.profile}`; checkpoints: {hashes}", ""]
        if c.number == 3 and c.figures.get("gains"):
            lines += [nine_table(c), ""]
    lines += ["## Plots", ""]
    for name, what in drawn.items():
        lines += [f"### {PLOT_TITLES[name]}", "", image(name, what) if isinstance(what, Path) else f"_{what}_", ""]
    return "\n".join(lines)


_STATUS_COLOUR = {C.PASS: "#1a7f37", C.FAIL: "#cf222e", C.UNDERPOWERED: "#9a6700", C.NOT_MEASURED: "#6e7781"}


def _png_data_uri(path: Path) -> str:
    import base64
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode()


def render_html(profile: str, verdicts: list[Claim], drawn: dict[str, Path | str], *, run: str,
                links: dict[str, str]) -> str:
    """The report as one self-contained HTML page: the claims table, each claim with its figures, and
    every plot inline (PNG data URIs), so the file opens anywhere — from `k3 ui`, from MLflow's
    artifact view, or from disk."""
    from html import escape

    def plot(name: str) -> str:
        what = drawn.get(name)
        if what is None:
            return ""
        body = (f'<img alt="{escape(PLOT_TITLES[name])}" src="{_png_data_uri(what)}">' if isinstance(what, Path)
                else f"<p class=missing>{escape(what)}</p>")
        return f'<figure id="plot-{name}"><figcaption>{escape(PLOT_TITLES[name])}</figcaption>{body}</figure>'

    def status(c: Claim) -> str:
        return f'<span class=status style="background:{_STATUS_COLOUR.get(c.status, "#6e7781")}">{escape(c.status)}</span>'

    counts = {s: sum(c.status == s for c in verdicts) for s in (C.PASS, C.FAIL, C.UNDERPOWERED, C.NOT_MEASURED)}
    parts = [f"<h1>K3 recipe claims report — profile <code>{escape(profile)}</code></h1>",
             f"<p>{counts[C.PASS]} pass, {counts[C.FAIL]} fail, {counts[C.UNDERPOWERED]} underpowered (power &lt; 0.8 "
             f"at the pre-registered effect: shown, not judged), {counts[C.NOT_MEASURED]} not measured. Run "
             f"<code>{escape(run)}</code>. " + " · ".join(f'<a href="{escape(u)}">{escape(t)}</a>' for t, u in links.items())
             + "</p>",
             "<table><tr><th>claim</th><th>title</th><th>status</th><th>n</th><th>power</th><th>figure</th>"
             "<th>target</th></tr>"]
    parts += [f'<tr><td><a href="#claim-{c.number}">{c.number}</a></td><td>{escape(c.title)}</td><td>{status(c)}</td>'
              f"<td>{'—' if c.n is None else c.n}</td><td>{_power(c)}</td><td>{escape(c.figure)}</td>"
              f"<td>{escape(c.target)}</td></tr>" for c in verdicts]
    parts.append("</table>")
    for c in verdicts:
        hashes = ", ".join(f"{escape(n)} <code>{escape(h[:12])}</code>" for n, h in c.checkpoints.items()) or "—"
        parts += [f'<h2 id="claim-{c.number}">Claim {c.number}: {escape(c.title)} {status(c)}</h2>',
                  f"<ul><li>{escape(c.reason)}</li><li>measured: {escape(c.figure)}</li>"
                  f"<li>target: {escape(c.target)}</li><li>n per cell: {'—' if c.n is None else c.n}; power: "
                  f"{_power(c)}</li><li>checkpoints: {hashes}</li></ul>"]
        if c.number == 3 and c.figures.get("gains"):
            cells = nine_cells(c)
            parts.append("<table><tr><th>domain</th>" + "".join(f"<th>{e}</th>" for e in EFFORTS) + "</tr>"
                         + "".join(f"<tr><th>{d}</th>" + "".join(f"<td>{escape(cells[(d, e)])}</td>" for e in EFFORTS)
                                   + "</tr>" for d in DOMAINS) + "</table>"
                         "<p class=note>SFT and specialist: success on the specialist's held-out tasks (same tasks "
                         "and seeds); gain in points with its paired 95 % interval.</p>")
        parts += [plot(name) for name, number in PLOT_CLAIM.items() if number == c.number]
    parts.append("<h2>The lineage</h2>")
    parts += [plot(name) for name, number in PLOT_CLAIM.items() if number is None]
    style = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#1f2328}"
             "table{border-collapse:collapse;margin:1em 0;font-size:0.9em}td,th{border:1px solid #d0d7de;padding:4px 8px;"
             "text-align:left;vertical-align:top}.status{color:#fff;border-radius:4px;padding:1px 6px;font-size:0.8em;white-space:nowrap}"
             "figure{margin:1em 0}figcaption{font-weight:600;margin-bottom:4px}img{max-width:100%}"
             ".missing,.note{color:#57606a;font-style:italic}")
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>K3 claims report — {escape(profile)}</title>"
            f"<style>{style}</style></head><body>" + "\n".join(parts) + "</body></html>\n")


def claim_check(c: dict[str, Any]) -> dg.AssetCheckResult:
    """A claim's verdict as its check's result: failing a claim warns (never blocks: a failing claim is
    reported, not hidden); a claim not measured or underpowered passes, saying so."""
    return dg.AssetCheckResult(check_name=f"claim_{c['number']}", passed=c["status"] != C.FAIL,
                               severity=dg.AssetCheckSeverity.WARN,
                               description=f"{c['status']}: {c['figure']}; {c['reason']}",
                               metadata={"status": c["status"], "figure": c["figure"], "target": c["target"],
                                         "checkpoints": dg.MetadataValue.json(c["checkpoints"])})


def materialize_report(context: dg.AssetExecutionContext, config: ReportConfig, profile: str) -> dg.MaterializeResult:
    tag_run(context, profile)
    if config.kernelsuite not in ("auto", "all", "sample", "off"):
        raise dg.Failure(description=f"ops.{profile}__report.config.kernelsuite = {config.kernelsuite!r}: choose "
                                     "auto, all, sample or off", allow_retries=False)
    store, mlflow = context.resources.store, context.resources.mlflow
    figs = gather(context.instance, profile, mlflow)
    mode = config.profile_values(profile)["kernelsuite"] if config.kernelsuite == "auto" else config.kernelsuite
    kernelsuite = None if mode == "off" else kernelsuite_rows(mode)
    verdicts = judge(figs, kernelsuite)
    for c in verdicts:
        context.log.info(c.line())

    out = store.report_dir(profile, "report", run_id(context))
    out.mkdir(parents=True, exist_ok=True)
    # The PNGs under plots/, as in the MLflow run's artifacts, so report.md's links work in both.
    drawn = report_plots(figs, verdicts, out / "plots")
    page = page_url(profile, run_id(context))
    text = render(profile, verdicts, drawn, page=page,
                  image=lambda name, png: f"![{PLOT_TITLES[name]}](plots/{png.name})")
    path = out / "report.md"
    path.write_text(text)
    claims_json = [c.as_dict() for c in verdicts]
    (out / "claims.json").write_text(json.dumps(claims_json, indent=1, default=str))
    digest = hashlib.sha256(json.dumps([{k: c[k] for k in ("number", "status", "figure", "checkpoints")}
                                        for c in claims_json], sort_keys=True, default=str).encode()).hexdigest()

    with mlflow.start_run(context, params={"profile": profile, "kernelsuite": mode,
                                           **{f"sha256.{n}": h for n, h in figs["checkpoints"].items()}},
                          tags=profile_tags(profile)) as run:
        links = {"Dagster asset": f"/assets/{profile}/report", "MLflow run": mlflow.run_url(run),
                 "newest report": page_url(profile)}
        html_path = out / "report.html"
        html_path.write_text(render_html(profile, verdicts, drawn, run=run_id(context), links=links))
        mlflow.log_metrics(run.info.run_id, {
            "claims/pass": sum(c.status == C.PASS for c in verdicts),
            "claims/fail": sum(c.status == C.FAIL for c in verdicts),
            "claims/not_measured": sum(c.status == C.NOT_MEASURED for c in verdicts),
            "claims/underpowered": sum(c.status == C.UNDERPOWERED for c in verdicts),
            **{f"claim_{c.number}/pass": float(c.status == C.PASS) for c in verdicts
               if c.status not in (C.NOT_MEASURED, C.UNDERPOWERED)},
            **{f"claim_{c.number}/power": c.power for c in verdicts if c.power is not None}})
        mlflow.log_rows(run.info.run_id, [{k: c[k] for k in ("number", "status", "figure", "target", "reason", "n",
                                                             "power")}
                                          for c in claims_json], "claims.json")
        client = mlflow.client()
        # report.html: MLflow's artifact view renders HTML (its Markdown view shows report.md as text).
        for f in (path, html_path):
            client.log_artifact(run.info.run_id, str(f))
        for what in drawn.values():
            if isinstance(what, Path):
                client.log_artifact(run.info.run_id, str(what), "plots")

    # Dagster's Markdown cannot load report.md's local PNGs: the UI's copy links each plot to its
    # place on the page (and to its own `plot/<name>` row, where it is inline).
    ui_text = render(profile, verdicts, drawn, page=page,
                     image=lambda name, png: f"[{PLOT_TITLES[name]} — on the report page]({page}#plot-{name}); "
                                             f"inline in this asset's `plot/{name}` row")
    claim3 = next(c for c in verdicts if c.number == 3)
    metadata: dict[str, Any] = {
        # First, so it is the first row of the asset's metadata: the report with every figure.
        "report_page": dg.MetadataValue.url(page),
        "path": dg.MetadataValue.path(str(path)),
        # The file's own hash (the data version is the claims' digest): `k3 run` re-hashes the file
        # to tell a damaged report from a fresh one (assets/lineage.py, verify_upstreams).
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "html": dg.MetadataValue.path(str(html_path)),
        "profile": profile,
        "claims_table": dg.MetadataValue.md(claims_table(verdicts)),
        **({"specialists_3x3": dg.MetadataValue.md(nine_table(claim3))} if claim3.figures.get("gains") else {}),
        "claims": dg.MetadataValue.json([{k: c[k] for k in ("number", "title", "status", "figure", "target", "reason",
                                                             "profile", "checkpoints", "n", "power")}
                                         for c in claims_json]),
        "claims/pass": sum(c.status == C.PASS for c in verdicts),
        "claims/fail": sum(c.status == C.FAIL for c in verdicts),
        "claims/not_measured": sum(c.status == C.NOT_MEASURED for c in verdicts),
        "claims/underpowered": sum(c.status == C.UNDERPOWERED for c in verdicts),
        "report": dg.MetadataValue.md(ui_text),
        "mlflow_run": dg.MetadataValue.url(mlflow.run_url(run)),
        **{f"plot/{name}": inline_png(what, PLOT_TITLES[name]) if isinstance(what, Path) else what
           for name, what in drawn.items()},
    }
    # The claims are judged in this step: a run that materializes the report evaluates them, however
    # it was launched (a re-execution of this one step included).
    selected = {k.name for k in context.selected_asset_check_keys}
    return dg.MaterializeResult(metadata=metadata, data_version=dg.DataVersion(digest), tags=profile_tags(profile),
                                check_results=[claim_check(c) for c in claims_json
                                               if f"claim_{c['number']}" in selected])


# ----------------------------------------------------------------------------------------------
# The nine specialists side by side (rl_specialist's overview)

def specialists_overview(instance: dg.DagsterInstance, profile: str, fresh: dict[str, dict[str, Any]],
                         out: Path) -> dict[str, dg.MetadataValue]:
    """The 3 × 3 summary and figure that every rl_specialist partition carries, so the asset's page
    (which shows its newest partition's metadata) opens on all nine: `fresh` (partition key →
    metadata) are the partitions this run made, the others their newest materialization.

    {"specialists_3x3": claim 3 per cell (SFT vs specialist, gain with interval, power, ✓ / ✗),
     "plot/specialists": each cell's rollout success by step and held-out success vs sft_policy's}."""
    from assets.plots import specialist_curves

    def plain(md: dict[str, Any]) -> dict[str, Any]:
        return {k: (v.value if isinstance(v, dg.MetadataValue) else v) for k, v in md.items()}

    sft = latest(instance, profile, "sft_policy")
    figs: dict[str, Any] = {"sft_policy": sft.metadata if sft else {}, "specialists": {}}
    for d in DOMAINS:
        for e in EFFORTS:
            pk = str(dg.MultiPartitionKey({"domain": d, "effort": e}))
            if pk in fresh:
                figs["specialists"][(d, e)] = plain(fresh[pk])
            elif (part := _partition_latest(instance, profile, "rl_specialist", pk)) is not None:
                figs["specialists"][(d, e)] = part["metadata"]
    sft_rates, specs = claim_3_inputs(figs)
    claim3 = C.claim_3(sft_rates, specs, profile=profile)
    cells = {}
    for cell, md in figs["specialists"].items():
        spec, base = specs.get(cell), sft_rates.get(cell)
        cells[cell] = {"reward_by_step": md.get("reward_by_step") or [],
                       "specialist": (spec["success_rate"] * spec["n"], spec["n"]) if spec and spec.get("n") else None,
                       "sft": (base["success_rate"] * base["n"], base["n"]) if base and base.get("n") else None}
    png = specialist_curves(cells, out / "specialists.png")
    return {"specialists_3x3": dg.MetadataValue.md(nine_table(claim3)),
            "plot/specialists": inline_png(png, "The nine specialists: rollout success by step, held-out vs SFT")}


def build(profile: str) -> list[dg.AssetsDefinition]:
    """`<profile>/report`, with its eight claim checks evaluated by the report's own step."""
    report_key = key(profile, "report")
    # Checks of the asset's own op (not separate check ops): every run that makes the report judges the
    # claims, and a re-executed report step has no check steps to lose (docs/log/report.md).
    claims = [dg.AssetCheckSpec(f"claim_{n}", asset=report_key,
                                description=f"Claim {n}: {C.TITLES[n]}. Warns when the report finds it failing; "
                                            "passes (saying so) when it is not measured.")
              for n in range(1, 9)]

    @dg.asset(name="report", key_prefix=[profile], group_name=group(profile, "report"),
              deps=[key(profile, n) for n in upstream_names()], kinds={"python", "mlflow"}, check_specs=claims,
              code_version=REPORT_CODE_VERSION, required_resource_keys={"store", "mlflow"}, tags=profile_tags(profile),
              description="The eight claims of docs/design.md §5 (figure, target, pass / fail / not measured, the "
                          "checkpoints measured) and the plots behind them, from what every asset logged; the "
                          f"whole report with its figures is a page: {page_url(profile)} on `k3 ui`'s webserver.")
    def report(context: dg.AssetExecutionContext, config: ReportConfig.for_profile(profile)) -> dg.MaterializeResult:
        return materialize_report(context, config, profile)
    return [report]
