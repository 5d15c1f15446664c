"""Asset keys per profile, finding an upstream asset's files, and the metadata every asset reports.

Every asset exists once per profile, under the key prefix of its profile (`smoke/corpus`,
`tiny/pretrain_stage_1`; `assets.profiles` builds them). Dagster therefore keeps one lineage per
profile: status, staleness and the recorded input versions (`dagster/input_data_version/<key>`)
never mix smoke with tiny.

Assets hand each other paths, not values: a materialization records `path` in its metadata and its
content hash as its data version. A downstream asset reads the newest materialization of each
upstream key of its own profile, and a missing or deleted upstream fails with the name of the asset
to materialize first.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from assets.integrity import verify_upstreams

PROFILE_TAG = "k3/profile"
# The profiles a run can use (k3model.config also has `k3`, the published shape, for accounting only).
PROFILES = ("smoke", "tiny", "small")


def key(profile: str, name: str) -> dg.AssetKey:
    """The asset key of `name` in `profile`'s lineage: `<profile>/<name>`."""
    return dg.AssetKey([profile, name])


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
    """
    instance = context.instance
    run = instance.get_run_by_id(run_id(context))
    if run is None:  # called directly, without a run
        return
    have = [p for p in run.tags.get(PROFILE_TAG, "").split(",") if p]
    if profile not in have:
        instance.add_run_tags(run.run_id, {PROFILE_TAG: ",".join(sorted([*have, profile]))})


def profile_tags(profile: str) -> dict[str, str]:
    return {PROFILE_TAG: profile}


def fmt(v: Any) -> str:
    """A table cell: floats to 4 significant digits, everything else as JSON."""
    if isinstance(v, float):
        return "NaN" if math.isnan(v) else f"{v:.4g}"
    return v if isinstance(v, str) else json.dumps(v, default=str)


def markdown_table(rows: list[dict[str, Any]], max_chars: int = 80) -> str:
    """A small Markdown table for metadata previews; long cells are cut to `max_chars`."""
    if not rows:
        return "(no rows)"
    cols = list(rows[0])

    def cell(v: Any) -> str:
        text = fmt(v).replace("\n", "⏎").replace("|", "\\|")
        return text if len(text) <= max_chars else text[: max_chars - 1] + "…"
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


# The Dagster UI renders Markdown metadata shorter than this in the metadata table itself; longer
# Markdown sits behind a "[Show Markdown]" link that opens it in a dialog.
INLINE_MARKDOWN_CHARS = 1000


def inline_png(path: Path, alt: str) -> dg.MetadataValue:
    """A PNG file as Markdown with the image as a data URI: the UI renders the picture (one click on
    "[Show Markdown]" for a full-size plot), where a `MetadataValue.path` shows only the file name."""
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return dg.MetadataValue.md(f"![{alt}](data:image/png;base64,{data})\n\n`{path}`")


def _png_markdown(image, alt: str, caption: str) -> str:
    import io
    buffer = io.BytesIO()
    image.save(buffer, "PNG", optimize=True)
    return f"![{alt}](data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}) {caption}"


def sparkline(values: list[float], alt: str, caption: str, width: int = 240, height: int = 48) -> dg.MetadataValue:
    """A two-colour line picture of `values`, small enough (about 400 characters) to show in the
    metadata table itself."""
    from PIL import Image, ImageDraw
    image = Image.new("P", (width, height), 0)
    image.putpalette([255, 255, 255, 79, 67, 221])
    finite = [(i, v) for i, v in enumerate(values) if math.isfinite(v)]
    if len(finite) >= 2:
        lo, hi = min(v for _, v in finite), max(v for _, v in finite)
        span = (hi - lo) or 1.0
        points = [(round(i * (width - 1) / (len(values) - 1)), round(2 + (height - 5) * (hi - v) / span))
                  for i, v in finite]
        ImageDraw.Draw(image).line(points, fill=1, width=2)
    return dg.MetadataValue.md(_png_markdown(image, alt, caption))


def thumbnail(image, alt: str, caption: str) -> dg.MetadataValue:
    """`image` (a PIL image) in 16 colours, at 2× when that still shows in the metadata table
    itself, else at 1× (behind "[Show Markdown]" only if even that is too large)."""
    from PIL import Image
    small = image.quantize(16)
    for scale in (2, 1):
        text = _png_markdown(small.resize((small.width * scale, small.height * scale), Image.NEAREST), alt, caption)
        if len(text) < INLINE_MARKDOWN_CHARS:
            break
    return dg.MetadataValue.md(text)
