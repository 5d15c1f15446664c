"""Every asset, once per profile: the factory the Definitions, jobs and `k3 run` are built from.

A profile's assets live under its key prefix (`smoke/corpus`, `tiny/pretrain_stage_1`) and in its
own groups (`smoke_data`, `tiny_pretraining`), so Dagster holds one lineage per profile: status,
staleness and the input versions a materialization records never mix profiles. The profile is not
a partition, because the RL specialists will need Dagster's two partition dimensions for
domain × effort.

Adding an asset (for example a post-training stage):
1. In its module, write `build(profile) -> list[AssetsDefinition]` (or `(assets, checks)`), each
   asset made with `key_prefix=[profile]`, `group_name=lineage.group(profile, "<group>")`,
   `tags=lineage.profile_tags(profile)`, its upstream as `deps=[lineage.key(profile, "<name>")]`, and a
   body that starts with `lineage.tag_run(context, profile)` and finds its inputs with
   `lineage.require_upstreams(context, [...], profile)`.
2. Add that `build` to `BUILDERS` below. The per-profile jobs and schedules pick it up; a test in
   tests/pipelines/test_definitions.py checks every key is prefixed by its profile.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import dagster as dg

from assets import checkpoint_checks, data, deploy, distill, evaluation, posttrain, pretrain, report, serve
from assets.lineage import PROFILES


@dataclass
class ProfileDefs:
    assets: list[dg.AssetsDefinition] = field(default_factory=list)
    checks: list[dg.AssetChecksDefinition] = field(default_factory=list)

    def add(self, built: list[dg.AssetsDefinition] | tuple[list, list]) -> None:
        if isinstance(built, tuple):
            self.assets += built[0]
            self.checks += built[1]
        else:
            self.assets += built


# report.build comes last: the report reads every other asset (and depends on those that exist).
BUILDERS: tuple[Callable[[str], list | tuple[list, list]], ...] = (data.build, pretrain.build, evaluation.build,
                                                                   posttrain.build, distill.build, deploy.build,
                                                                   serve.build, report.build)


def build_profile(profile: str) -> ProfileDefs:
    """The assets and checks of one profile."""
    defs = ProfileDefs()
    for build in BUILDERS:
        defs.add(build(profile))
    defs.checks += checkpoint_checks.build(profile, defs.assets)  # finite and intact, blocking
    return defs


def build_all(profiles: tuple[str, ...] = PROFILES) -> dict[str, ProfileDefs]:
    return {p: build_profile(p) for p in profiles}
