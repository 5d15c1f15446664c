"""Asset keys per profile, finding an upstream asset's files and verifying them on read, and the
metadata every asset reports.

Every asset exists once per profile, under the key prefix of its profile (`smoke/corpus`,
`tiny/pretrain_stage_1`; `assets.profiles` builds them). Dagster therefore keeps one lineage per
profile: status, staleness and the recorded input versions (`dagster/input_data_version/<key>`)
never mix smoke with tiny.

Assets hand each other paths, not values: a materialization records `path` in its metadata and its
content hash as its data version. A downstream asset reads the newest materialization of each
upstream key of its own profile, and a missing or deleted upstream fails with the name of the asset
to materialize first.

Verification on read: an upstream's files must still be the bytes its materialization recorded.
The data assets are content-addressed (`data/<profile>/<asset>/<sha256[:16]>/`), and the recorded
data version *is* the file's sha256; a checkpoint's data version is the sha256 of its weights, and
its manifest lists the hash of every file. Without this check, 256 flipped bytes in `corpus.parquet`
surface as `OSError: Unexpected end of stream` naming no file, and a `tokenizer.json` edited into
another valid tokenizer is used silently. So every read through `require_upstreams` re-hashes
first (`verify_upstreams`), and any damage or read error names the file and what to
re-materialize. Re-materializing replaces the damaged file (`assets/storage.py`). Display helpers
for metadata (tables, pictures) are in `assets.display`.

The edges the UI draws (`without_implied_deps`): an asset declares every upstream it reads, but an
edge u → a that a longer path u → … → a already implies is left out of the Definitions (the
transitive reduction of the read graph), so the lineage reads left to right, data → stages → base →
SFT → specialists → student → quantized → draft → report / served model, instead of the data and the
tokenizer fanning into every node. Reachability — and so run order, and `k3 run`'s staleness, which
follows every ancestor (pipelines/freshness.py) — is unchanged. An edge whose recorded input version
an asset reads back (`KEPT_EDGES`) stays.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from k3model.checkpoint import CheckpointCorrupted, sha256_file, verify_checkpoint

PROFILE_TAG = "k3/profile"
# Who launched a run: "k3 run" (pipelines/cli.py), or "re-execution of <parent>" (`tag_run`).
LAUNCHED_BY_TAG = "k3/launched_by"
# The profiles a run can use (k3model.config also has `k3`, the published shape, for accounting only).
PROFILES = ("smoke", "tiny", "small")


def key(profile: str, name: str) -> dg.AssetKey:
    """The asset key of `name` in `profile`'s lineage: `<profile>/<name>`."""
    return dg.AssetKey([profile, name])


# (downstream, upstream) edges kept although a longer path implies them: the report matches each
# stage that checkpoint_evals scored to the stage version it recorded as its input
# (`dagster/input_data_version/<profile>/pretrain_stage_<s>`, assets/report.py `_rescored`), and
# Dagster records that only for a direct dependency.
KEPT_EDGES = frozenset(("checkpoint_evals", f"pretrain_stage_{s}") for s in range(1, 5))


def group(profile: str, name: str) -> str:
    """The group of `profile`'s assets of one kind (`smoke_data`, `tiny_pretraining`)."""
    return f"{profile}_{name}"


@dataclass(frozen=True)
class Upstream:
    name: str
    path: Path
    data_version: str
    run_id: str
    metadata: dict[str, Any]


def latest(instance: dg.DagsterInstance, profile: str, name: str, partition: str | None = None) -> Upstream | None:
    """The newest materialization of `<profile>/<name>` (of one partition of it, if given) that
    recorded a path, or None."""
    if partition is None:
        event = instance.get_latest_materialization_event(key(profile, name))
    else:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key(profile, name), asset_partitions=[partition]), limit=1).records
        event = records[0].event_log_entry if records else None
    if event is None or event.asset_materialization is None:
        return None
    mat = event.asset_materialization
    if "path" not in mat.metadata:
        return None
    return Upstream(name=name, path=Path(mat.metadata["path"].value),
                    data_version=(mat.tags or {}).get("dagster/data_version", ""), run_id=event.run_id,
                    metadata={k: v.value for k, v in mat.metadata.items()})


def require_upstream(context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext, name: str,
                     profile: str) -> Upstream:
    """`latest`, or a Failure naming the asset to materialize first."""
    return require_upstreams(context, [name], profile)[name]


def require_upstreams(context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext,
                      names: list[str] | tuple[str, ...], profile: str) -> dict[str, Upstream]:
    """The newest materialization of each of `names` for `profile`; a Failure naming every one that
    is missing (or whose files are gone), so the user learns in one go what to materialize first."""
    me = _my_name(context)
    found = {name: latest(context.instance, profile, name) for name in names}
    missing = [n for n, up in found.items() if up is None]
    gone = [n for n, up in found.items() if up is not None and not up.path.exists()]
    if missing or gone:
        todo = missing + gone
        what = []
        if missing:
            what.append(f"{', '.join(missing)} {'has' if len(missing) == 1 else 'have'} not been "
                        f"materialized for profile {profile!r}")
        if gone:
            what.append(f"the files of {', '.join(gone)} no longer exist "
                        f"({', '.join(str(found[n].path) for n in gone)})")
        raise dg.Failure(
            description=f"{me} cannot run: {'; '.join(what)}. Materialize {', '.join(todo)} first "
                        f"(`k3 run --profile {profile} --select '{','.join('*' + n for n in todo)}'`, "
                        "or Materialize in the UI)",
            allow_retries=False)
    verify_upstreams(me, found, profile)
    return found


def upstream_problem(up: Upstream) -> str | None:
    """What is wrong with an upstream's files (damaged, unreadable), or None when they verify."""
    try:
        if up.path.is_dir():
            actual = verify_checkpoint(up.path).sha256
            what = f"checkpoint {up.path}"
        else:
            actual = sha256_file(up.path)
            what = f"file {up.path}"
    except CheckpointCorrupted as e:
        return str(e)
    except OSError as e:
        return f"cannot read {e.filename or up.path}: {e.strerror or e}"
    expected = up.metadata.get("sha256") or up.data_version
    if expected and actual != expected:
        return (f"{what} is damaged: its sha256 is {actual} but its materialization (run "
                f"{up.run_id[:8]}) recorded {expected}")
    return None


def verify_upstreams(me: str, ups: dict[str, Upstream], profile: str) -> None:
    """A Failure naming every damaged or unreadable upstream and how to rebuild it."""
    problems = {name: p for name, up in ups.items() if (p := upstream_problem(up)) is not None}
    if problems:
        what = [f"cannot start from {n}: {p}" if ups[n].path.is_dir() else f"{me} cannot run: {n}: {p}"
                for n, p in problems.items()]
        raise dg.Failure(
            description="; ".join(what) + f". Re-materialize {', '.join(problems)} (`k3 run --profile "
                        f"{profile} --select {','.join(problems)}`, which replaces damaged files, or "
                        "Materialize in the UI)",
            allow_retries=False)


def _my_name(context) -> str:
    try:
        return context.asset_key.path[-1]
    except Exception:  # a check context or a multi-asset step
        return context.op_def.name


def run_id(context) -> str:
    """The Dagster run id; "EPHEMERAL" when the asset is called directly (`context.run` is then
    unset, and `context.run_id` is deprecated)."""
    return context.op_execution_context.run_id


def tag_run(context: dg.AssetExecutionContext, profile: str) -> None:
    """Put the profile on the run as the tag `k3/profile`, so the Runs page tells profiles apart.

    Jobs, schedules and `k3 run` set the tag when they launch; a run the UI launches from an asset
    page (Dagster's implicit asset job) gets it here, when its first step starts. A run that
    materializes several profiles is tagged with all of them, comma-separated.

    A re-execution (from the UI's Runs page, or `dagster.execute_job`) copies every tag of its
    parent, `k3/launched_by: k3 run` included; here it becomes `re-execution of <parent>`, so the
    Runs page does not say it came from the CLI (`k3 run` never launches a run with a parent).
    """
    instance = context.instance
    run = instance.get_run_by_id(run_id(context))
    if run is None:  # called directly, without a run
        return
    tags = {}
    have = [p for p in run.tags.get(PROFILE_TAG, "").split(",") if p]
    if profile not in have:
        tags[PROFILE_TAG] = ",".join(sorted([*have, profile]))
    parent = run.tags.get("dagster/parent_run_id")
    if parent and run.tags.get(LAUNCHED_BY_TAG) == "k3 run":
        tags[LAUNCHED_BY_TAG] = f"re-execution of {parent[:8]}"
    if tags:
        instance.add_run_tags(run.run_id, tags)


def profile_tags(profile: str) -> dict[str, str]:
    return {PROFILE_TAG: profile}


def implied_deps(parents: dict[dg.AssetKey, set[dg.AssetKey]]) -> dict[dg.AssetKey, set[dg.AssetKey]]:
    """{asset: the parents that another parent already descends from} of a DAG given as
    {asset: parents}: the edges a transitive reduction leaves out, less `KEPT_EDGES`.

    An upstream p of a is implied when p is an ancestor of some other parent q of a (p → … → q → a).
    """
    ancestors: dict[dg.AssetKey, set[dg.AssetKey]] = {}

    def above(k: dg.AssetKey) -> set[dg.AssetKey]:
        if k not in ancestors:
            ancestors[k] = set()
            for p in parents.get(k, ()):
                ancestors[k] |= {p} | above(p)
        return ancestors[k]
    implied = {}
    for k, ps in parents.items():
        drop = {p for p in ps if any(p in above(q) for q in ps if q != p)
                and (k.path[-1], p.path[-1]) not in KEPT_EDGES}
        if drop:
            implied[k] = drop
    return implied


def without_implied_deps(assets: list[dg.AssetsDefinition]) -> list[dg.AssetsDefinition]:
    """`assets` with the dependencies `implied_deps` finds left out (the edges the UI draws).

    Each asset's body still reads what it reads (`require_upstreams` finds upstreams by name, not by
    edge); only the declared edge goes, and with it Dagster's record of that input's version.
    """
    parents = {spec.key: {d.asset_key for d in spec.deps} for a in assets for spec in a.specs}
    implied = implied_deps(parents)

    def reduce(spec: dg.AssetSpec) -> dg.AssetSpec:
        drop = implied.get(spec.key)
        return spec.replace_attributes(deps=[d for d in spec.deps if d.asset_key not in drop]) if drop else spec
    return [a.map_asset_specs(reduce) if any(k in implied for k in a.keys) else a for a in assets]
