"""Jobs, per profile: everything of the profile (what `k3 run` executes, so its runs re-execute
from the UI) and the nightly re-evaluation. Each job tags its runs with `k3/profile`.

One run holds the whole lineage, partitioned specialists included. Dagster lets a job mix
unpartitioned assets with assets of ONE partitions definition; a run then says which partitions it
materializes with the tags `dagster/asset_partition_range_start` / `_end` (the unpartitioned steps
ignore them). `<profile>_all_job` carries the range of every partition of
`assets.posttrain.SPECIALIST_PARTITIONS` (domain × effort, nine), so a run of the job — `k3 run`,
the weekly schedule, a launch from the UI — trains all nine specialists in one step
(`BackfillPolicy.single_run`, concurrent Ray tasks) between the assets above and below them.
`k3 run` narrows the range to the partitions that are missing or stale (`partition_range_tags`).
A second, different partitions definition in a profile would not fit one job: Dagster refuses it when
the definitions load.
"""

import dagster as dg

from assets.lineage import PROFILE_TAG, key
from assets.posttrain import SPECIALIST_PARTITIONS
from assets.profiles import PROFILES

RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"


def all_job_name(profile: str) -> str:
    return f"{profile}_all_job"


def eval_job_name(profile: str) -> str:
    return f"{profile}_eval_job"


def partition_range_tags(partitions_def: dg.PartitionsDefinition, partitions: list[str] | None = None) -> dict[str, str]:
    """The run tags that make one run materialize `partitions` (default: all) of `partitions_def`.

    A range of a two-dimensional definition is a rectangle, from the first to the last key of each
    dimension (`general_tasks|high` … `general_agents|max` is 2 × 2 keys, not the keys between them
    in the flat order): the tags give the smallest rectangle that covers `partitions`.
    """
    keys = partitions_def.get_partition_keys()
    partitions = keys if partitions is None else partitions
    unknown = [p for p in partitions if p not in keys]
    if unknown:
        raise ValueError(f"partition(s) {', '.join(unknown)} do not exist: the partitions are {', '.join(keys)}")
    if not isinstance(partitions_def, dg.MultiPartitionsDefinition):
        ordered = [k for k in keys if k in set(partitions)]
        return {RANGE_START: ordered[0], RANGE_END: ordered[-1]}
    dims = partitions_def.partitions_defs  # in the order of the key's "|"-separated parts
    lo, hi = {}, {}
    for i, dim in enumerate(dims):
        values = dim.partitions_def.get_partition_keys()
        chosen = [values.index(p.split("|")[i]) for p in partitions]
        lo[dim.name], hi[dim.name] = values[min(chosen)], values[max(chosen)]
    return {RANGE_START: str(dg.MultiPartitionKey(lo)), RANGE_END: str(dg.MultiPartitionKey(hi))}


ALL_JOBS = {p: dg.define_asset_job(
    all_job_name(p), selection=dg.AssetSelection.key_prefixes([p]),
    tags={PROFILE_TAG: p, **partition_range_tags(SPECIALIST_PARTITIONS)},
    description=f"Every asset of the {p} profile, in lineage order, the nine RL specialists in one step "
                f"(`k3 run --profile {p}` runs a selection of this job).") for p in PROFILES}

EVAL_JOBS = {p: dg.define_asset_job(
    eval_job_name(p), selection=dg.AssetSelection.assets(key(p, "checkpoint_evals")), tags={PROFILE_TAG: p},
    description=f"Re-score the newest checkpoint of every {p} stage on the full evaluation set.")
    for p in PROFILES}

JOBS = [*ALL_JOBS.values(), *EVAL_JOBS.values()]
