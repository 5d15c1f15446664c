"""Which selected assets a `k3 run` has to materialize: the missing and the stale, per profile.

A plain Dagster run re-materializes everything it selects (research/orchestration.md §1), so a
rerun after a crash retrained stages that the killed run had already finished. `k3 run` now skips
an asset when, for the run's profile, all of these hold:

- it has a materialization, and its files still verify (`assets.lineage.upstream_problem`);
- that materialization was made by the asset's current `code_version`;
- each upstream's newest materialization is the one it consumed (Dagster records the consumed
  versions as `dagster/input_data_version/<upstream>` tags);
- no ancestor is itself re-materialized by this run (an ancestor, not only a parent: the
  Definitions leave out an edge that a longer path implies, assets/lineage.py, and stage 2 still
  reads the corpus that stage 1 descends from).

`k3 run --force` materializes the whole selection regardless. Every asset exists once per profile
(`<profile>/<name>`, assets/profiles.py), so "for the run's profile" is simply the profile's own
keys: their newest materialization and the input versions it recorded (`<profile>/<upstream>`).
Dagster's own staleness (`staleStatus` in the UI) knows neither the file checks nor this run's plan,
which is why this is computed here.

A partitioned asset (rl_specialist: domain × effort) is judged partition by partition, each on its
own newest materialization; `stale_plan` says which partitions to run. Below a partitioned upstream,
Dagster records a hash over the upstream's partitions as the consumed version, so there the
consumed event (`dagster/input_event_pointer/<upstream>`, a storage id) is compared with the
upstream's newest materialization instead.
"""

from __future__ import annotations

import dagster as dg

from assets.lineage import latest, upstream_problem

_INPUT_TAG = "dagster/input_data_version/"
_POINTER_TAG = "dagster/input_event_pointer/"


def stale_assets(instance: dg.DagsterInstance, asset_graph, selected: list[dg.AssetKey],
                 profile: str) -> dict[dg.AssetKey, str]:
    """{key: why it must be materialized} for the keys of `selected` (all of `profile`) that are
    missing or stale, in lineage order."""
    return stale_plan(instance, asset_graph, selected, profile)[0]


def stale_plan(instance: dg.DagsterInstance, asset_graph, selected: list[dg.AssetKey],
               profile: str) -> tuple[dict[dg.AssetKey, str], dict[dg.AssetKey, list[str]]]:
    """`stale_assets`, and for each partitioned key among them the partitions that are missing or
    stale (every partition is judged on its own newest materialization)."""
    wanted = set(selected)
    todo: dict[dg.AssetKey, str] = {}
    partitions: dict[dg.AssetKey, list[str]] = {}
    for key in asset_graph.toposorted_asset_keys:
        if key not in wanted:
            continue
        node = asset_graph.get(key)
        if node.partitions_def is None:
            why = _why_stale(instance, asset_graph, node, profile, todo, None)
            if why is not None:
                todo[key] = why
            continue
        whys = {pk: w for pk in node.partitions_def.get_partition_keys()
                if (w := _why_stale(instance, asset_graph, node, profile, todo, pk)) is not None}
        if whys:
            partitions[key] = list(whys)
            shown = "; ".join(f"{pk}: {w}" for pk, w in list(whys.items())[:3])
            more = f"; and {len(whys) - 3} more" if len(whys) > 3 else ""
            todo[key] = f"{len(whys)} partition(s) to materialize ({shown}{more})"
    return todo, partitions


def _why_stale(instance: dg.DagsterInstance, asset_graph, node, profile: str, todo: dict[dg.AssetKey, str],
               partition: str | None) -> str | None:
    up = latest(instance, profile, node.key.path[-1], partition)
    if up is None:
        return f"never materialized for profile {profile!r}"
    if not up.path.exists():
        return f"its files are gone ({up.path})"
    problem = upstream_problem(up)
    if problem is not None:
        return problem
    tags = _tags_of(instance, node.key, up.run_id, partition)
    recorded_code = tags.get("dagster/code_version")
    if node.code_version is not None and recorded_code != node.code_version:
        return f"its code changed ({recorded_code} → {node.code_version})"
    # A parent first, when one is redone: the nearest reason reads best.
    redone = sorted((k for k in asset_graph.get_ancestor_asset_keys(node.key) if k in todo),
                    key=lambda k: (k not in node.parent_keys, k.to_user_string()))
    if redone:
        return f"its upstream {redone[0].path[-1]} is re-materialized in this run"
    for parent in sorted(node.parent_keys, key=lambda k: k.to_user_string()):
        parent_name = parent.path[-1]
        if asset_graph.get(parent).partitions_def is not None and node.partitions_def is None:
            # Dagster records a hash over the parent's partitions as the consumed version; the
            # consumed event (a storage id) says the same more simply: was there a newer one since?
            consumed_id = tags.get(_POINTER_TAG + parent.to_user_string())
            records = instance.fetch_materializations(parent, limit=1).records
            if consumed_id is not None and records and records[0].storage_id > int(consumed_id):
                return f"its upstream {parent_name} changed since"
            continue
        current = latest(instance, parent.path[0], parent_name)
        consumed = tags.get(_INPUT_TAG + parent.to_user_string())
        if current is not None and consumed is not None and current.data_version != consumed:
            return f"its upstream {parent_name} changed since"
    return None


def _tags_of(instance: dg.DagsterInstance, key: dg.AssetKey, run_id: str, partition: str | None) -> dict[str, str]:
    """The tags of `key`'s materialization (of `partition`) in run `run_id`."""
    for record in instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records:
        mat = record.event_log_entry.dagster_event.event_specific_data.materialization
        if mat.asset_key == key and (partition is None or mat.partition == partition):
            return dict(mat.tags or {})
    return {}
