"""Display helpers for asset metadata in the Dagster UI: floats rounded, small Markdown tables (split
by columns where the UI would clip them), PNG files and PIL images inlined as data URIs, sparklines
of a metric's curve. The plots themselves are drawn in
`assets.plots`.
"""

from __future__ import annotations

import base64
import json
import math
import re
from pathlib import Path
from typing import Any

import dagster as dg


def fmt(v: Any) -> str:
    """A table cell: floats to 4 significant digits, everything else as JSON."""
    if isinstance(v, float):
        return "NaN" if math.isnan(v) else f"{v:.4g}"
    return v if isinstance(v, str) else json.dumps(v, default=str)


# About how many characters of a table row the Dagster UI's metadata value column shows at a
# 1440-px-wide window before it clips the table (research/turn3-ux.md, ux3-05: base_model's
# `stages` was cut after its seventh column); each column costs its widest word plus ~3 of padding.
TABLE_WIDTH_CHARS = 60


def _min_width(text: str) -> int:
    """The narrowest a cell can be: its longest word (the UI wraps a cell at spaces and hyphens)."""
    return max((len(w) for w in re.split(r"[\s-]+", text)), default=0)


def rounded(metadata: dict[str, Any], digits: int = 6) -> dict[str, Any]:
    """`metadata` with every plain float entry kept to `digits` significant digits (the UI shows a
    float as stored: `0.6896551724137931`); NaN and inf stay. Six digits change no figure a claim
    reads (a rate of n ≤ 10⁴ keeps its whole number of hits)."""
    return {k: float(f"{v:.{digits}g}") if isinstance(v, float) else v for k, v in metadata.items()}


def markdown_table(rows: list[dict[str, Any]], max_chars: int = 80, width_chars: int | None = TABLE_WIDTH_CHARS) -> str:
    """A small Markdown table for metadata previews; long cells are cut to `max_chars`.

    A table wider than `width_chars` (its columns' narrowest widths, plus padding) is split by
    columns into several tables, each repeating the row's label — the fewest leading columns that
    tell the rows apart (`stage`; `domain, effort`) — so that none is clipped in the UI. None: one
    table however wide (a file read elsewhere, report.md).
    """
    if not rows:
        return "(no rows)"
    cols = list(rows[0])

    def cell(v: Any) -> str:
        text = fmt(v).replace("\n", "⏎").replace("|", "\\|")
        return text if len(text) <= max_chars else text[: max_chars - 1] + "…"
    cells = [[cell(r.get(c)) for c in cols] for r in rows]
    widths = [max(_min_width(t) for t in [c, *(row[i] for row in cells)]) + 3 for i, c in enumerate(cols)]
    n_label = next((k for k in range(1, len(cols)) if len({tuple(row[:k]) for row in cells}) == len(cells)), 1)
    label_width = sum(widths[:n_label])
    parts: list[list[int]] = [[]]
    for i in range(n_label, len(cols)):
        if parts[-1] and width_chars is not None and label_width + sum(widths[j] for j in parts[-1]) + widths[i] > width_chars:
            parts.append([])
        parts[-1].append(i)
    tables = []
    for part in parts:
        shown = [*range(n_label), *part]
        lines = ["| " + " | ".join(cols[i] for i in shown) + " |", "|" + "---|" * len(shown)]
        lines += ["| " + " | ".join(row[i] for i in shown) + " |" for row in cells]
        tables.append("\n".join(lines))
    return "\n\n".join(tables)


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
