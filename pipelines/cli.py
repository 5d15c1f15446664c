"""`k3`: the project's command line (docs/design.md §8; usage in docs/orchestration.md).

    k3 run [--profile P] [--select ASSETS] [--force] [--wait]
                                             materialize the profile's missing and stale assets
                                             headless (all selected with --force), one progress
                                             line per asset
    k3 ui [--port N] [--mlflow-port M] [--wait]
                                             Dagster web UI + daemon and the MLflow UI on 127.0.0.1
    k3 params --profile P [--json]           total and active parameter counts (no weights allocated)
    k3 report [--profile P]                  where the latest claims report is, one line per claim
    k3 bench [GROUP/]NAME                    run benchmarks/GROUP/NAME.py
    k3 serve [--profile P | --model PATH] [--port 8000] [--draft auto|off]
                                             the served student behind an OpenAI-compatible API
                                             (k3model/server.py)
    k3 chat [--url URL] [--effort E]         a terminal client for `k3 serve` (pipelines/chat.py)

`run` and `ui` use the instance under `.k3/` (`K3_HOME` moves it), so runs started either way share
one history, one MLflow store and one checkpoint store. Each holds the home's lock while it runs (one
at a time per home; `--wait` queues behind the holder) and first cleans up after crashed runs
(pipelines/home_lock.py, pipelines/recovery.py). Errors are one line; `--verbose` adds tracebacks.
`k3 ui`'s servers are started and stopped by pipelines/ui.py; what the commands share (messages,
the home's lock, interrupts) is pipelines/console.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

from pipelines.console import say, stop_on_signals, under_home_lock, watch_interrupts
from pipelines.resources import REPO_ROOT, RUNNABLE_PROFILES, check_profile_name, default_profile
from pipelines.ui import cmd_ui

# docs/design.md §1, in lineage order: what the pipeline will hold when the recipe is complete.
DESIGN_LINEAGE = (
    "tokenizer", "corpus", "clue_data", "image_data",
    "pretrain_stage_1", "pretrain_stage_2", "pretrain_stage_3", "pretrain_stage_4", "base_model",
    "env_task_sets", "sft_policy", "rl_specialist", "mopd_student", "quantized_student",
    "draft_model", "served_model", "report",
)


# ----------------------------------------------------------------------------------------------
# k3 run

# Assets a plain `k3 run` leaves out: the nightly re-scoring of checkpoints would repeat, right after
# training, the evaluation every stage has just run (its schedule and `--select` still run it).
SCHEDULED_ONLY = ("checkpoint_evals",)


def _selection(select: str | None, profile: str, mine: dict):
    """`--select a,b,*c,d*`: names within the profile (`corpus` is `<profile>/corpus`); `*name` adds
    everything upstream, `name*` everything downstream. No selection: every asset of the profile
    except SCHEDULED_ONLY. `mine` maps the profile's asset names to their keys."""
    import difflib

    import dagster as dg
    if not select:
        return dg.AssetSelection.key_prefixes([profile]) - dg.AssetSelection.assets(
            *[mine[n] for n in SCHEDULED_ONLY if n in mine])
    sel = None
    for raw in (s.strip() for s in select.split(",")):
        name = raw.strip("*")
        if name not in mine:
            close = difflib.get_close_matches(name, list(mine), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else "."
            raise SystemExit(f"k3 run: --select names unknown asset {name!r}{hint} The assets are: "
                             f"{', '.join(sorted(mine))}")
        # A profile's assets depend only on its own assets, so up- and downstream stay inside it.
        part = dg.AssetSelection.assets(mine[name])
        if raw.startswith("*"):
            part = part.upstream()
        if raw.endswith("*"):
            part = part.downstream()
        sel = part if sel is None else sel | part
    return sel


def _chosen_partitions(text: str, graph, keys) -> dict:
    """`--partition a|b,c|d`: the partitions of the selected partitioned asset to run; a SystemExit
    naming the keys that exist for a key that does not."""
    parted = [k for k in keys if graph.get(k).partitions_def is not None]
    if not parted:
        raise SystemExit("k3 run: --partition needs a partitioned asset in the selection (rl_specialist)")
    chosen = [p.strip() for p in text.split(",") if p.strip()]
    out = {}
    for k in parted:
        valid = graph.get(k).partitions_def.get_partition_keys()
        unknown = [p for p in chosen if p not in valid]
        if unknown:
            raise SystemExit(f"k3 run: --partition {', '.join(unknown)}: no such partition of {k.path[-1]}; "
                             f"its partitions are {', '.join(valid)}")
        out[k] = chosen
    return out


def _config_overrides(sets: list[str], defs, mine: dict, keys) -> dict:
    """`--set ASSET.FIELD=VALUE ...` as the run config's `ops` section: each value read as JSON (20,
    3e-4, true, "x", a list: `--set mopd_student.domains='["general_tasks"]'`, single-quoted for the
    shell), else kept as a string. A SystemExit names what to change for an unknown asset or field,
    or for an asset the run will not materialize (up to date: add --force)."""
    ops: dict = {}
    for item in sets:
        target, eq, raw = item.partition("=")
        name, dot, field = target.strip().partition(".")
        if not eq or not dot or not name or not field:
            raise SystemExit(f"k3 run: --set {item!r}: write ASSET.FIELD=VALUE, e.g. --set pretrain_stage_1.steps=20")
        if name not in mine:
            raise SystemExit(f"k3 run: --set {item!r}: no asset {name!r}; the assets are: {', '.join(sorted(mine))}")
        if mine[name] not in keys:
            raise SystemExit(f"k3 run: --set {item!r}: {name} is not materialized by this run (select it, "
                             "or add --force if it is up to date)")
        node = defs.resolve_assets_def(mine[name]).node_def
        fields = node.config_schema.config_type.fields if node.config_schema else {}
        if field not in fields:
            raise SystemExit(f"k3 run: --set {item!r}: {name} has no config field {field!r}; its fields are: "
                             f"{', '.join(sorted(fields)) or 'none'}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        _check_set_type(item, name, field, fields[field].config_type, value)
        ops.setdefault(node.name, {"config": {}})["config"][field] = value
    return ops


def _check_set_type(item: str, name: str, field: str, config_type, value) -> None:
    """A SystemExit naming the field, the value and the type the field takes when `value` is not
    of it, before the run starts (Dagster would only say "Error in config for job")."""
    from dagster._config import validate_config
    result = validate_config(config_type, value)
    if not result.success:
        wanted = (config_type.given_name or config_type.key).replace("Noneable.", "").replace("SourceType", "")
        raise SystemExit(f"k3 run: --set {item!r}: {name}.{field} must be {wanted}, not {json.dumps(value)} "
                         f"({type(value).__name__}); e.g. --set {name}.{field}="
                         + {"Int": "20", "Float": "3e-4", "Bool": "true"}.get(
                             wanted, "'[\"text\"]'" if wanted.startswith("Array") else '"text"'))


def _check_config_values(ops: dict, defs, mine: dict, keys, profile: str) -> None:
    """A SystemExit naming field and value when an overridden asset config fails its validation
    (finite, in range: assets/config_bounds.py) or cannot fit this machine, before the run starts."""
    from assets.config_bounds import AssetConfig, describe_invalid
    for name, key in mine.items():
        if key not in keys:
            continue
        assets_def = defs.resolve_assets_def(key)
        node = assets_def.node_def
        if node.name not in ops or not assets_def.op.compute_fn.has_config_arg():
            continue
        config_class = assets_def.op.compute_fn.get_config_arg().annotation
        if not (isinstance(config_class, type) and issubclass(config_class, AssetConfig)):
            continue
        try:
            config = config_class(**ops[node.name]["config"])
            config.check_fits(profile)
        except ValueError as e:  # pydantic's ValidationError is a ValueError
            raise SystemExit(f"k3 run: --set refused before the run: {describe_invalid(name, e)}") from None


def _label(step_key: str) -> str:
    """`smoke__corpus` (the op of asset `smoke/corpus`) → `smoke/corpus`."""
    return step_key.replace("__", "/", 1)


class _Progress(threading.Thread):
    """Prints one line per asset as its step starts and ends, reading the run's event log."""

    def __init__(self, instance, run_id: str):
        super().__init__(daemon=True)
        self.instance, self.run_id = instance, run_id
        self.stop = threading.Event()
        self.t0 = time.perf_counter()
        self.started: dict[str, float] = {}
        self.failed: list[str] = []
        self.warnings: list[str] = []  # checks that failed with severity WARN
        self.interrupted = False  # a step failed because the run was interrupted (Ctrl-C, SIGTERM)

    def _line(self, msg: str) -> None:
        say(f"[{time.perf_counter() - self.t0:7.1f}s] {msg}")

    def run(self) -> None:
        from dagster import DagsterEventType
        kinds = {DagsterEventType.STEP_START, DagsterEventType.STEP_SUCCESS, DagsterEventType.STEP_FAILURE,
                 DagsterEventType.ASSET_MATERIALIZATION, DagsterEventType.ASSET_CHECK_EVALUATION}
        cursor = None
        while True:
            done = self.stop.is_set()
            try:
                conn = self.instance.get_records_for_run(self.run_id, cursor=cursor, of_type=kinds)
            except Exception:  # the run's storage may not exist yet
                conn = None
            if conn is not None:
                cursor = conn.cursor
                for record in conn.records:
                    self._show(record.event_log_entry)
            if done:
                return
            self.stop.wait(0.5)

    def _show(self, entry) -> None:
        from dagster import DagsterEventType
        ev = entry.dagster_event
        step = _label(ev.step_key or "")
        if ev.event_type == DagsterEventType.STEP_START:
            self.started[step] = time.perf_counter()
            self._line(f"▶ {step}")
        elif ev.event_type == DagsterEventType.ASSET_MATERIALIZATION:
            mat = ev.event_specific_data.materialization
            md = mat.metadata
            shown = {"dagster/row_count": "rows", "eval/ppl": "ppl", "eval/clue_acc/scattered/all": "clue_acc",
                     "eval/success_rate": "success", "perf/wall_s": "wall_s"}
            bits = [f"{label}={md[k].value:.4g}" if isinstance(md[k].value, float) else f"{label}={md[k].value}"
                    for k, label in shown.items() if k in md]
            version = (ev.event_specific_data.materialization.tags or {}).get("dagster/data_version", "")
            if version:
                bits.append(f"version={version[:12]}")
            where = f"[{mat.partition}]" if mat.partition else ""
            self._line(f"  ◆ {mat.asset_key.to_user_string()}{where} materialized {' '.join(bits)}")
        elif ev.event_type == DagsterEventType.ASSET_CHECK_EVALUATION:
            check = ev.event_specific_data
            name = f"{check.asset_key.to_user_string()}:{check.check_name}"
            description = check.description or ""
            if check.passed:
                self._line(f"  ✓ check {name} passed" + (f": {description}" if description else ""))
            elif check.severity.value == "WARN":
                self.warnings.append(f"{name} ({description})" if description else name)
                self._line(f"  ⚠ check {name} warns: {description}")
            else:
                self._line(f"  ✗ check {name} FAILED: {description}")
        elif ev.event_type == DagsterEventType.STEP_SUCCESS:
            took = time.perf_counter() - self.started.get(step, self.t0)
            self._line(f"✓ {step} ({took:.1f} s)")
        elif ev.event_type == DagsterEventType.STEP_FAILURE:
            err = ev.event_specific_data.error
            self.failed.append(step)
            if _is_interruption(err):
                self.interrupted = True
                self._line(f"✗ {step}: interrupted")
            else:
                self._line(f"✗ {step}: {_root_message(err)}")


# workspace.yaml's code location, which `k3 ui` serves.
CODE_LOCATION = "k3"


def _record_origin_for_the_ui(instance, job_name: str, checks: set | None = None) -> None:
    """Make the runs this instance object creates re-executable from the UI.

    `execute_in_process` records no remote origin, and the UI's "Re-execute" looks the job up by the
    origin's code location and repository (a run without one cannot be re-executed, whatever its
    job). The origin named here is the one `k3 ui` serves: workspace.yaml's location `k3`, the
    Definitions' single repository.

    Nor does it record which checks the run executes (None: those of the selected assets). The UI
    re-executes a selection of steps with the run's asset selection and its check selection, a
    missing one taken as none (Dagster 1.13's getReexecutionParamsForSelection): the report's
    claims would be dropped, so `checks` (the checks of the selected assets) is recorded instead.
    """
    from dagster._core.definitions.repository_definition import SINGLETON_REPOSITORY_NAME
    from dagster._core.remote_origin import (ManagedGrpcPythonEnvCodeLocationOrigin, RemoteJobOrigin,
                                             RemoteRepositoryOrigin)
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    origin = RemoteJobOrigin(
        repository_origin=RemoteRepositoryOrigin(
            code_location_origin=ManagedGrpcPythonEnvCodeLocationOrigin(
                loadable_target_origin=LoadableTargetOrigin(executable_path=sys.executable,
                                                            module_name="pipelines.definitions",
                                                            working_directory=str(REPO_ROOT)),
                location_name=CODE_LOCATION),
            repository_name=SINGLETON_REPOSITORY_NAME),
        job_name=job_name)
    create = instance.create_run_for_job

    def create_run_for_job(*args, **kwargs):
        kwargs.setdefault("remote_job_origin", origin)
        return create(*args, **kwargs)
    instance.create_run_for_job = create_run_for_job
    if checks is None:
        return
    # create_run_for_job passes asset_check_selection=None to the run domain's create_run.
    domain = instance.run_domain
    create_run = domain.create_run

    def create_run_with_checks(**kwargs):
        if kwargs.get("asset_selection") and kwargs.get("asset_check_selection") is None:
            kwargs["asset_check_selection"] = {c for c in checks if c.asset_key in kwargs["asset_selection"]}
        return create_run(**kwargs)
    domain.create_run = create_run_with_checks


def _is_interruption(err) -> bool:
    # Dagster's own wrapper, or our KeyboardInterrupt raised inside a step (a SIGTERM during
    # ray.init: RayResource._ensure).
    while err is not None:
        if err.cls_name in ("DagsterExecutionInterruptedError", "KeyboardInterrupt"):
            return True
        err = err.cause or err.context
    return False


def _root_message(err) -> str:
    """The user's own message in a SerializableErrorInfo: the first cause past Dagster's wrappers."""
    while err is not None and err.cause is not None and err.cls_name.startswith("Dagster"):
        err = err.cause
    if err is None:
        return "unknown error"
    # The message reads "<module>.<Class>: text"; a Failure's text is the whole story.
    text = err.message.strip()
    head, sep, rest = text.partition(": ")
    if sep and head.endswith(err.cls_name):
        text = rest if err.cls_name == "Failure" else f"{err.cls_name}: {rest}"
    if err.cls_name.startswith("RayTaskError(") and "\n" in text:
        text = _worker_exception(text)
    return text


def _worker_exception(text: str) -> str:
    """A Ray task's "<Class>: <message>" (all of a message's lines, joined) and where it was raised,
    from the worker's traceback that RayTaskError's text carries: a CUDA error's last line alone
    ("Compile with `TORCH_USE_CUDA_DSA` …") names neither the error nor the place."""
    lines = text.splitlines()
    frames = [i for i, line in enumerate(lines) if re.match(r'\s*File "', line)]
    if not frames:
        return lines[-1].strip()
    start = frames[-1] + 1
    while start < len(lines) and lines[start][:1].isspace():  # the frame's source line and carets
        start += 1
    message = " ".join(line.strip() for line in lines[start:] if line.strip()) or lines[-1].strip()
    where = re.match(r'\s*File "([^"]+)", line (\d+), in (\S+)', lines[frames[-1]])
    return f"{message} (raised at {where[1]}:{where[2]} in {where[3]})" if where else message


def cmd_run(args: argparse.Namespace) -> int:
    try:
        profile = check_profile_name(args.profile, field="--profile")
    except ValueError as e:
        say(f"k3 run: {e}")
        return 2
    return under_home_lock("k3 run", profile, args, _run)


def _run(args: argparse.Namespace, profile: str, env: dict[str, str]) -> int:
    import dagster as dg
    from assets.lineage import LAUNCHED_BY_TAG
    from pipelines.definitions import defs
    from pipelines.jobs import all_job_name

    # The profile's own job, which the definitions hold: the UI can re-execute the run it makes.
    job = defs.resolve_job_def(all_job_name(profile))
    graph = defs.resolve_asset_graph()
    mine = {k.path[-1]: k for k in graph.get_all_asset_keys() if k.path[0] == profile}
    missing = [name for name in DESIGN_LINEAGE if name not in mine]
    keys = sorted(_selection(args.select, profile, mine).resolve(graph), key=lambda k: k.to_user_string())
    # Partitioned assets (rl_specialist) run in the same run as the rest: the job's tags give the
    # partition range (pipelines/jobs.py); these narrow it to what is asked for or stale.
    partitions: dict = {}
    if args.partition:
        partitions = _chosen_partitions(args.partition, graph, keys)
    if not args.force:
        from pipelines.freshness import stale_plan
        todo, stale_parts = stale_plan(dg.DagsterInstance.get(), graph, keys, profile)
        if partitions:
            # Only the chosen partitions count: a stale partition that was not asked for stays.
            todo = {k: w for k, w in todo.items() if k not in partitions or set(stale_parts.get(k, ())) & set(partitions[k])}
            partitions = {k: [p for p in ps if p in stale_parts.get(k, ())] for k, ps in partitions.items() if k in todo}
        else:
            partitions = {k: ps for k, ps in stale_parts.items() if k in todo}
        fresh = [k.path[-1] for k in keys if k not in todo]
        if fresh:
            say(f"k3 run: up to date for profile {profile}, skipped: {', '.join(fresh)} (--force redoes them)")
        if not todo and not args.set:
            say("k3 run: nothing to materialize")
            return 0
        for k, why in todo.items():
            say(f"k3 run: {k.path[-1]}: {why}")
        keys = sorted(todo, key=lambda k: k.to_user_string())
    names = [k.path[-1] for k in keys]
    ops = _config_overrides(args.set, defs, mine, keys)
    _check_config_values(ops, defs, mine, keys, profile)
    tags = {"k3/profile": profile, LAUNCHED_BY_TAG: "k3 run"}
    if partitions:
        from pipelines.jobs import partition_range_tags
        [(pkey, chosen)] = partitions.items()  # one partitions definition per profile (pipelines/jobs.py)
        tags.update(partition_range_tags(graph.get(pkey).partitions_def, chosen))
        say(f"k3 run: {pkey.path[-1]}: partition(s) {tags['dagster/asset_partition_range_start']} … "
            f"{tags['dagster/asset_partition_range_end']} in one step ({len(chosen)} asked for)")

    say(f"k3 run: profile {profile}, {len(keys)} asset(s): {', '.join(names)}")
    if missing:
        say(f"k3 run: not in the pipeline yet (docs/design.md §1): {', '.join(missing)}")
    say(f"k3 run: Dagster instance {env['DAGSTER_HOME']} (open it with `k3 ui`)")

    # SIGTERM (a CI timeout, `kill`) takes the Ctrl-C path: the Ray task is cancelled, the local
    # cluster stopped and the run recorded as failed, instead of dying mid-write.
    stop_on_signals()
    watch_interrupts()
    instance = dg.DagsterInstance.get()
    _record_origin_for_the_ui(instance, job.name, {c for c in graph.asset_check_keys if c.asset_key in set(keys)})
    run_id = str(uuid.uuid4())
    progress = _Progress(instance, run_id)
    progress.start()
    # Failures are reported by the progress lines and the summary; Dagster's own console lines
    # (a stack trace per failed step and run) only with --verbose.
    run_config = {"loggers": {"console": {"config": {"log_level": "DEBUG" if args.verbose else "CRITICAL"}}}}
    if ops:
        run_config["ops"] = ops
        say(f"k3 run: config overrides {json.dumps(ops)}")
    try:
        result = job.execute_in_process(run_config=run_config, instance=instance, run_id=run_id,
                                        asset_selection=keys, raise_on_error=False, tags=tags)
    except KeyboardInterrupt:
        result = None
    # Let the progress thread print the run's last events before the summary.
    progress.stop.set()
    progress.join()
    if result is None or progress.interrupted:
        # Inside a step, Dagster turns the interrupt into a failed step and returns normally.
        say(f"k3 run: interrupted; run {run_id} is recorded as failed, and a stage run again resumes "
            "from its last checkpoint")
        return 130
    took = time.perf_counter() - progress.t0
    if result.success:
        if progress.warnings:
            say(f"k3 run: success with {len(progress.warnings)} check warning(s) in {took:.1f} s (run {run_id}):")
            for warning in progress.warnings:
                say(f"  ⚠ {warning}")
        else:
            say(f"k3 run: success in {took:.1f} s (run {run_id})")
        return 0
    failed = progress.failed or ["run setup"]
    say(f"k3 run: FAILED in {took:.1f} s at {', '.join(failed)} (run {run_id}); "
        "`k3 ui` shows the full log")
    if not progress.failed:
        # A failure before any step (resource or config errors) has no step event: say it here.
        for ev in result.all_events:
            if ev.is_failure and ev.event_specific_data is not None and getattr(ev.event_specific_data, "error", None):
                say(f"k3 run: {_root_message(ev.event_specific_data.error)}")
                break
    return 1


# ----------------------------------------------------------------------------------------------
# k3 params, report, bench

def cmd_params(args: argparse.Namespace) -> int:
    from k3model.params import count_params, format_counts
    try:
        counts = count_params(args.profile)
    except ValueError as e:
        say(f"k3 params: {e}")
        return 2
    say(json.dumps(counts, indent=2) if args.json else format_counts(counts))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Where the newest claims report of the profile is, the links to it, and one line per claim."""
    from pipelines.instance import apply_k3_environ
    apply_k3_environ()
    import dagster as dg

    from assets.claims import Claim
    from assets.lineage import key
    from assets.report import page_url
    asset = key(args.profile, "report")
    make = f"`k3 run --profile {args.profile} --select report`"
    event = dg.DagsterInstance.get().get_latest_materialization_event(asset)
    if event is None or event.asset_materialization is None:
        say(f"k3 report: no report yet for profile {args.profile}: {make} makes one from whatever the lineage "
            f"holds (`k3 run --profile {args.profile}` runs the whole lineage, the report last)")
        return 1
    md = {k: v.value for k, v in event.asset_materialization.metadata.items()}
    path = md.get("path")
    if path is None or not Path(path).exists():
        say(f"k3 report: the newest {asset.to_user_string()} (run {event.run_id}) has no file at {path}: "
            f"{make} writes it again")
        return 1
    say(f"k3 report: {path}")
    dagster_url = f"http://127.0.0.1:{args.port}"
    # The page (report.html, every figure inline) is served by `k3 ui`'s webserver.
    links = [f"Page {dagster_url}{page_url(args.profile)}", f"Dagster {dagster_url}/assets/{args.profile}/report"]
    if isinstance(md.get("mlflow_run"), str):
        # The metadata link goes through the Dagster webserver's redirect to wherever MLflow is served.
        links.append(f"MLflow {dagster_url}{md['mlflow_run']}")
    up = _ui_running(dagster_url)
    say(f"k3 report: {'   '.join(links)}" + ("" if up else "   (no `k3 ui` answers there now: start it to open these)"))
    verdicts = md.get("claims") or []
    counts = {s: sum(c["status"] == s for c in verdicts) for s in ("pass", "fail", "underpowered", "not measured")}
    say(f"k3 report: {counts['pass']} pass, {counts['fail']} fail, {counts['underpowered']} underpowered, "
        f"{counts['not measured']} not measured (profile {args.profile}, run {event.run_id})")
    for c in verdicts:
        claim = Claim(c["number"], c["title"], c["status"], c["figure"], c["target"], c["reason"], c["profile"],
                      c.get("checkpoints", {}), n=c.get("n"), power=c.get("power"))
        say(f"  {claim.line()}")
    return 0


def _ui_running(dagster_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{dagster_url}/server_info", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def cmd_bench(args: argparse.Namespace) -> int:
    bench_dir = REPO_ROOT / "benchmarks"
    script = bench_dir / f"{args.name}.py"
    found = sorted(bench_dir.glob(f"*/{args.name}.py"))
    if not script.is_file() and len(found) == 1:  # a bare name: the one group that holds it
        script = found[0]
    if not script.is_file():
        names = sorted(str(p.relative_to(bench_dir).with_suffix("")) for p in bench_dir.glob("*/*.py"))
        say(f"k3 bench: no benchmark {args.name!r}; available: {', '.join(names) or 'none yet'}")
        return 2
    # Benchmarks import `benchmarks.common` and the library from the checkout (they are scripts, not
    # an installed package), as on the GPU machine where `PYTHONPATH=.` is how they run.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.call([sys.executable, str(script), *args.bench_args], cwd=REPO_ROOT, env=env)


def cmd_serve(args: argparse.Namespace) -> int:
    from k3model.server import K3Server, load_served
    from pipelines.serve import resolve_paths
    paths = resolve_paths(args.profile, args.model, args.tokenizer, args.draft_model)
    served = load_served(paths["model"], paths["tokenizer"], None if args.draft == "off" else paths["draft"],
                         model_id=args.served_name)
    server = K3Server(served, args.host, args.port, max_batch=args.max_batch, verbose=args.verbose)
    say(f"k3 serve: {served.model_id} ({served.quantization}, draft "
        f"{served.draft_path if served.draft is not None else 'off'}) from {served.path}")
    say(f"k3 serve: http://{args.host}:{server.server_address[1]}/v1 (Ctrl-C stops)")
    # `kill -USR1 <pid>` prints every thread's stack to stderr: where a server that will not stop hangs.
    import faulthandler
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    stop_on_signals()
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.close()
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from pipelines.chat import main as chat
    return chat(args.url, args.effort, args.temperature, args.max_tokens)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="k3", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    profiles = ", ".join(RUNNABLE_PROFILES)
    run = sub.add_parser("run", help="materialize assets headless",
                         description="Materialize a profile's assets in this process, one progress line per "
                                     "asset, through the profile's job (<profile>_all_job), so the UI can "
                                     "re-execute the run. Usage: docs/orchestration.md.")
    run.add_argument("--profile", default=default_profile(),
                     help=f"one of {profiles} (default: %(default)s: K3_PROFILE, else tiny; tiny trains for "
                          "17-50 minutes on a 2-core CPU, smoke in about a minute)")
    run.add_argument("--select", help="comma-separated asset names within the profile; *name adds its upstream, "
                     f"name* its downstream (default: every asset but {', '.join(SCHEDULED_ONLY)}, which the "
                     "nightly schedule runs)")
    run.add_argument("--partition", help="comma-separated partitions of a partitioned asset in the selection "
                     "(rl_specialist: <domain>|<effort>, e.g. 'coding_agents|max'); default: every missing or stale "
                     "one (all with --force)")
    run.add_argument("--verbose", action="store_true", help="print Dagster's own log lines too (with the "
                     "stack traces of failed steps)")
    run.add_argument("--force", action="store_true", help="materialize every selected asset, even "
                     "those up to date (default: only the missing, stale or damaged ones)")
    run.add_argument("--wait", action="store_true", help="if another `k3 run` or `k3 ui` holds this "
                     "K3_HOME, wait for it instead of refusing")
    run.add_argument("--set", action="append", default=[], metavar="ASSET.FIELD=VALUE",
                     help="override one config field of a selected asset (repeatable; VALUE read as JSON), "
                          "e.g. --set pretrain_stage_1.steps=20 or a list, --set "
                          "mopd_student.domains='[\"general_tasks\"]'; the UI's launchpad shows every field")
    run.set_defaults(fn=cmd_run)

    ui = sub.add_parser("ui", help="Dagster web UI + daemon and the MLflow UI on 127.0.0.1",
                        description="Serve the Dagster UI (every profile's lineage, under the prefixes "
                                    f"{profiles}) and MLflow on 127.0.0.1, both on the instance under K3_HOME.")
    ui.add_argument("--port", type=int, default=3000, help="Dagster web UI port (default: %(default)s)")
    ui.add_argument("--mlflow-port", type=int, default=5000, help="MLflow UI port (default: %(default)s)")
    ui.add_argument("--wait", action="store_true", help="if another `k3 run` or `k3 ui` holds this "
                    "K3_HOME, wait for it instead of refusing")
    ui.add_argument("--verbose", action="store_true", help="full tracebacks on errors")
    ui.set_defaults(fn=cmd_ui)

    params = sub.add_parser("params", help="total and active parameter counts")
    params.add_argument("--profile", default=default_profile(),
                        help=f"one of {profiles}, or k3 (the published shape) (default: %(default)s)")
    params.add_argument("--json", action="store_true", help="print JSON instead of a table")
    params.set_defaults(fn=cmd_params)

    report = sub.add_parser("report", help="where the latest claims report is")
    report.add_argument("--profile", default=default_profile(), help="whose report (default: %(default)s)")
    report.add_argument("--port", type=int, default=3000, help="the port `k3 ui` serves Dagster on, for the "
                        "links (default: %(default)s)")
    report.set_defaults(fn=cmd_report)

    bench = sub.add_parser("bench", help="run benchmarks/GROUP/NAME.py")
    bench.add_argument("name")
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    bench.set_defaults(fn=cmd_bench)

    serve = sub.add_parser("serve", help="serve the student behind an OpenAI-compatible API",
                           description="Serve a profile's newest quantized_student (with its draft_model) or any "
                                       "checkpoint on /v1/completions and /v1/chat/completions (k3model/server.py).")
    serve.add_argument("--profile", default=default_profile(), help="whose newest served student (default: %(default)s)")
    serve.add_argument("--model", help="a checkpoint directory instead (float or MXFP4 export), or a registered "
                       "model version (k3-tiny-base@champion)")
    serve.add_argument("--tokenizer", help="its tokenizer.json (default: the profile's newest tokenizer)")
    serve.add_argument("--draft-model", help="a draft checkpoint (default with --profile: the newest draft_model)")
    serve.add_argument("--draft", choices=("auto", "off"), default="auto",
                       help="speculative decoding with the draft when one is found (default: %(default)s)")
    serve.add_argument("--served-name", help="the model id clients name (default: k3-<profile>-<sha256[:12]>)")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default: %(default)s)")
    serve.add_argument("--port", type=int, default=8000, help="(default: %(default)s)")
    serve.add_argument("--max-batch", type=int, default=16, help="rows one decode step holds (default: %(default)s)")
    serve.add_argument("--verbose", action="store_true", help="log every request and full tracebacks")
    serve.set_defaults(fn=cmd_serve)

    chat = sub.add_parser("chat", help="a terminal client for `k3 serve`")
    chat.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default: %(default)s)")
    chat.add_argument("--effort", choices=("low", "high", "max"), default="high", help="(default: %(default)s)")
    chat.add_argument("--temperature", type=float, default=0.7, help="(default: %(default)s)")
    chat.add_argument("--max-tokens", type=int, help="default: the effort's budget")
    chat.set_defaults(fn=cmd_chat)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        say(f"k3 {args.command}: interrupted")
        return 130
    except Exception as e:  # noqa: BLE001 - the last resort: one line, the traceback on request
        if getattr(args, "verbose", False):
            raise
        say(f"k3 {args.command}: {_one_line(e)} (--verbose shows the traceback)")
        return 1


def _one_line(e: BaseException) -> str:
    if isinstance(e, OSError) and e.filename:
        return f"{e.strerror or type(e).__name__}: {e.filename}"
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def console_main() -> None:
    """The `k3` console script. After an interruption, exit at once: a SIGTERM that cut ray.init short
    leaves Ray's half-built core worker behind, whose destructor aborts the interpreter's normal exit
    (SIGABRT instead of 130)."""
    code = main()
    if code == 130:
        if os.environ.get("K3_HOME"):
            from pipelines.resources import end_leftover_ray_processes
            # Only this command's own cluster: another run on the home may be training.
            end_leftover_ray_processes(os.environ["K3_HOME"], owner=os.getpid())
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    sys.exit(code)


if __name__ == "__main__":
    console_main()
