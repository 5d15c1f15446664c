"""Jobs, per profile: everything of the profile (what `k3 run` executes, so its runs re-execute
from the UI) and the nightly re-evaluation. Each job tags its runs with `k3/profile`."""

import dagster as dg

from assets.lineage import PROFILE_TAG, key
from assets.profiles import PROFILES


def all_job_name(profile: str) -> str:
    return f"{profile}_all_job"


def eval_job_name(profile: str) -> str:
    return f"{profile}_eval_job"


ALL_JOBS = {p: dg.define_asset_job(
    all_job_name(p), selection=dg.AssetSelection.key_prefixes([p]), tags={PROFILE_TAG: p},
    description=f"Every asset of the {p} profile, in lineage order (`k3 run --profile {p}` runs a "
                "selection of this job).") for p in PROFILES}

EVAL_JOBS = {p: dg.define_asset_job(
    eval_job_name(p), selection=dg.AssetSelection.assets(key(p, "checkpoint_evals")), tags={PROFILE_TAG: p},
    description=f"Re-score the newest checkpoint of every {p} stage on the full evaluation set.")
    for p in PROFILES}

JOBS = [*ALL_JOBS.values(), *EVAL_JOBS.values()]
