"""Finding an upstream asset's files for this run's profile, and the metadata every asset reports.

Assets hand each other paths, not values: a materialization records `path` in its metadata, its
content hash as its data version, and the profile as the tag `k3/profile`. A downstream asset looks
up the newest materialization of each upstream asset *for its own profile* in the instance's event
log, so materializing the smoke profile never feeds a tiny run, and a missing or deleted upstream
fails with the name of the asset to materialize first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from assets.integrity import verify_upstreams

PROFILE_TAG = "k3/profile"
# How many recent materializations of an asset to search for one of the wanted profile.
_SEARCH_DEPTH = 200


@dataclass(frozen=True)
class Upstream:
    name: str
    path: Path
    data_version: str
    run_id: str
    metadata: dict[str, Any]


def latest_for_profile(instance: dg.DagsterInstance, name: str, profile: str) -> Upstream | None:
    """The newest materialization of asset `name` made with `profile`, or None."""
    records = instance.fetch_materializations(dg.AssetKey(name), limit=_SEARCH_DEPTH).records
    for record in records:
        mat = record.asset_materialization
        tags = mat.tags or {}
        if tags.get(PROFILE_TAG) != profile or "path" not in mat.metadata:
            continue
        return Upstream(name=name, path=Path(mat.metadata["path"].value),
                        data_version=tags.get("dagster/data_version", ""), run_id=record.run_id,
                        metadata={k: v.value for k, v in mat.metadata.items()})
    return None


def require_upstream(context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext, name: str,
                     profile: str) -> Upstream:
    """`latest_for_profile`, or a Failure naming the asset to materialize first."""
    return require_upstreams(context, [name], profile)[name]


def require_upstreams(context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext,
                      names: list[str] | tuple[str, ...], profile: str) -> dict[str, Upstream]:
    """The newest materialization of each of `names` for `profile`; a Failure naming every one that
    is missing (or whose files are gone), so the user learns in one go what to materialize first."""
    me = _my_name(context)
    found = {name: latest_for_profile(context.instance, name, profile) for name in names}
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
                        f"(`k3 run --profile {profile} --select {','.join('*' + n for n in todo)}`, "
                        "or Materialize in the UI)",
            allow_retries=False)
    verify_upstreams(me, found, profile)
    return found


def _my_name(context) -> str:
    try:
        return context.asset_key.to_user_string()
    except Exception:  # a check context or a multi-asset step
        return context.op_def.name


def run_id(context) -> str:
    """The Dagster run id; "EPHEMERAL" when the asset is called directly (`context.run` is then
    unset, and `context.run_id` is deprecated)."""
    return context.op_execution_context.run_id


def profile_tags(profile: str) -> dict[str, str]:
    return {PROFILE_TAG: profile}


def markdown_table(rows: list[dict[str, Any]], max_chars: int = 80) -> str:
    """A small Markdown table for metadata previews; long cells are cut to `max_chars`."""
    if not rows:
        return "(no rows)"
    cols = list(rows[0])

    def cell(v: Any) -> str:
        text = v if isinstance(v, str) else json.dumps(v, default=str)
        text = text.replace("\n", "⏎").replace("|", "\\|")
        return text if len(text) <= max_chars else text[: max_chars - 1] + "…"
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)
