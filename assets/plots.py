"""The matplotlib plots of the assets, drawn headless (Agg) into PNG files that the assets log to
MLflow and inline into their Dagster metadata (`assets.display.inline_png`).

- `stage_losses`: one pretraining stage's loss and expert-load curves (assets/pretrain.py).
- `clue_accuracy_by_stage`: checkpoint_evals' clue accuracy by distance, per stage (assets/evaluation.py).
- `specialist_curves`: the nine RL specialists side by side, each cell's rollout success by step and
  its held-out success against sft_policy's on the same tasks (rl_specialist's overview).
- `retention_heatmap`: the MOPD student's success over each teacher's, domain × effort (mopd_student
  and the report).
- `report_plots`: the claims report's plots, each drawn only when its figures exist (assets/report.py).
"""

from pathlib import Path
from typing import Any

from assets import claims as C
from assets.claims import DOMAINS, EFFORTS, Claim


def stage_losses(history: list[dict], path: Path, title: str) -> Path:
    """A pretraining stage's plot: its training loss and its expert load (max / mean) by step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    fig, (ax_loss, ax_load) = plt.subplots(1, 2, figsize=(10, 3.5))
    for key in ("train/main", "train/total"):
        if any(key in h for h in history):
            ax_loss.plot(steps, [h.get(key, float("nan")) for h in history], label=key)
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss")
    ax_loss.legend()
    ax_loss.set_title(title)
    if any("moe/load_max_over_mean" in h for h in history):
        ax_load.plot(steps, [h.get("moe/load_max_over_mean", float("nan")) for h in history])
    ax_load.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax_load.set_xlabel("step")
    ax_load.set_ylabel("expert load max / mean")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def clue_accuracy_by_stage(rows: list[dict[str, Any]], buckets: list[str], path: Path, profile: str) -> Path:
    """checkpoint_evals' plot: scattered-clue accuracy by distance bucket, one line per stage."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for row in rows:
        ax.plot(buckets, [row.get(b, float("nan")) for b in buckets], marker="o", label=f"stage {row['stage']}")
    ax.set_xlabel("clue distance (tokens)")
    ax.set_ylabel("scattered-clue accuracy")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(f"clue accuracy by distance, per stage ({profile})")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------------------------
# The claims report (each drawn only when its figures exist)

def _figure(path: Path, draw, size=(6, 3.5)) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=size)
    draw(ax)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def retention_heatmap(retention: dict[str, float | None], path: Path) -> Path:
    """`retention["<domain>/<effort>"]` (student ÷ teacher success, None where the teacher scored 0)
    as a domain × effort heatmap with the percentages written in; a cell without a key reads "not
    distilled" (a student of a subset of the routes, mopd_student.domains/efforts)."""
    def matrix(ax):
        grid = [[retention.get(f"{d}/{e}") for e in EFFORTS] for d in DOMAINS]
        values = [[float("nan") if v is None else v for v in row] for row in grid]
        im = ax.imshow(values, vmin=0, vmax=1.2, cmap="viridis")
        for i, (d, row) in enumerate(zip(DOMAINS, grid)):
            for j, (e, v) in enumerate(zip(EFFORTS, row)):
                # Empty (NaN) cells are the axes' white: their text in gray.
                text = (f"{v:.0%}" if v is not None else "—" if f"{d}/{e}" in retention else "not\ndistilled")
                ax.text(j, i, text, ha="center", va="center", color="white" if v is not None else "gray",
                        fontsize=10 if v is not None else 7)
        ax.set_xticks(range(3), EFFORTS)
        ax.set_yticks(range(3), DOMAINS, fontsize=7)
        ax.set_title("student / teacher success")
        ax.figure.colorbar(im, ax=ax)
    return _figure(path, matrix, size=(5, 3.5))


def specialist_curves(cells: dict[tuple[str, str], dict[str, Any]], path: Path) -> Path:
    """The nine specialists side by side, domain (rows) × effort (columns).

    `cells[(domain, effort)]`: {"reward_by_step": [rollout success per GRPO step], "specialist":
    (successes, n), "sft": (successes, n)} — the held-out success of the specialist and of sft_policy
    on the same tasks, drawn after the last step with Wilson 95 % intervals. A missing cell reads
    "not trained"."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from k3model.train.stats import wilson

    fig, axes = plt.subplots(len(DOMAINS), len(EFFORTS), figsize=(9, 6.5), sharey=True)
    for i, d in enumerate(DOMAINS):
        for j, e in enumerate(EFFORTS):
            ax = axes[i][j]
            cell = cells.get((d, e))
            if i == 0:
                ax.set_title(e, fontsize=9)
            if j == 0:
                ax.set_ylabel(d, fontsize=8)
            ax.set_ylim(-0.05, 1.05)
            if cell is None:
                ax.text(0.5, 0.5, "not trained", ha="center", va="center", transform=ax.transAxes, color="gray")
                continue
            curve = cell.get("reward_by_step") or []
            ax.plot(range(1, len(curve) + 1), curve, lw=1, color="C0")
            # The held-out pair one step past the last, SFT a little left of the specialist.
            end = len(curve) + 1
            for name, color, dx in (("sft", "C1", -0.2), ("specialist", "C2", 0.2)):
                if cell.get(name) is None:
                    continue
                hits, n = cell[name]
                lo, hi = wilson(hits, n)
                rate = hits / n if n else float("nan")
                ax.errorbar([end + dx], [rate], yerr=[[rate - lo], [hi - rate]], fmt="o", color=color, capsize=2, ms=4)
                ax.annotate(f"n={n}", (end + dx, hi), textcoords="offset points", xytext=(0, 3), ha="center",
                            fontsize=5, color=color)
            ax.set_xlim(0.5, end + 0.8)
            ax.tick_params(labelsize=7)
    from matplotlib.lines import Line2D
    fig.legend(handles=[Line2D([], [], color="C0", lw=1, label="rollout success by GRPO step"),
                        Line2D([], [], color="C1", marker="o", ls="", label="held-out: sft_policy"),
                        Line2D([], [], color="C2", marker="o", ls="", label="held-out: specialist (95 % Wilson)")],
               loc="upper center", ncol=3, fontsize=7, frameon=False)
    fig.supxlabel("GRPO step (held-out evaluation after the last step)", fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=70)
    plt.close(fig)
    return path


def report_plots(figs: dict[str, Any], verdicts: list[Claim], out: Path) -> dict[str, Path | str]:
    """The claims report's plots: {plot name: PNG path, or the reason it is not drawn}."""
    got: dict[str, Path | str] = {}
    by = {c.number: c for c in verdicts}

    def put(name: str, draw, missing: str, size=(6, 3.5)) -> None:
        got[name] = _figure(out / f"{name}.png", draw, size) if draw else f"not measured: {missing}"

    def losses(ax):
        # One after another in lineage order, each stage's steps after the last one's.
        offset = 0
        for name, (metric, points) in figs["losses"].items():
            ax.plot([offset + p[0] for p in points], [p[1] for p in points], label=f"{name} ({metric})", lw=1)
            offset += points[-1][0]
            ax.axvline(offset, color="gray", lw=0.5, ls=":")
        ax.set_xlabel("step (the stages one after another)")
        ax.set_ylabel("training loss")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    put("loss_curves", losses if figs["losses"] else None, "no asset's MLflow run has a training-loss history")

    by_distance = by[1].figures.get("by_distance", {})
    buckets = sorted(by_distance, key=lambda b: int(b.split("-")[0]))

    def clue(ax):
        stages = sorted({int(s) for row in by_distance.values() for s in row})
        for s in stages:
            rows = [by_distance[b].get(str(s)) for b in buckets]
            xs = [i for i, r in enumerate(rows) if r]
            acc = [rows[i]["acc"] for i in xs]
            err = [[max(rows[i]["acc"] - rows[i]["lo"], 0.0) for i in xs],
                   [max(rows[i]["hi"] - rows[i]["acc"], 0.0) for i in xs]]
            line = ax.errorbar([x + 0.05 * s for x in xs], acc, yerr=err, marker="o", capsize=2,
                               label=f"stage {s} scattered")
            ax.plot(xs, [rows[i]["control"] for i in xs], ls="--", color=line[0].get_color(), alpha=0.6,
                    label=f"stage {s} control")
        ax.set_xticks(range(len(buckets)), buckets, fontsize=7)
        ax.set_xlabel("clue distance (tokens)")
        ax.set_ylabel("accuracy (95 % interval)")
        ax.set_ylim(-0.05, 1.05)
        ax.legend(fontsize=6, ncol=2)
    put("clue_accuracy", clue if by_distance else None, "no stage reports clue accuracy with counts")

    ablation = figs.get("ablation")

    def load(ax):
        for name, points in figs["load_curves"].items():
            ax.plot([p[0] for p in points], [p[1] for p in points], lw=1, label=f"{name} (lineage)")
        for arm, rec in (ablation or {}).get("arms", {}).items():
            if arm in ("quantile", "none"):
                ax.plot(range(1, len(rec["load_max_over_mean"]) + 1), rec["load_max_over_mean"], lw=1, ls=":",
                        label=f"probe, {'no balancing' if arm == 'none' else arm}")
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.axhline(C.LOAD_NEAR, color="red", lw=0.6, ls="--")
        ax.set_xlabel("step (each stage and probe arm from its own start)")
        ax.set_ylabel("expert load max / mean")
        ax.legend(fontsize=6)
    put("expert_load", load if figs["load_curves"] or ablation else None, "no expert-load history")

    gains = by[3].figures.get("gains", {})

    def vs_sft(ax):
        names = list(gains)
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], [gains[n]["sft"] for n in names], width=0.4, label="SFT")
        ax.bar([x + 0.2 for x in xs], [gains[n]["specialist"] for n in names], width=0.4, label="specialist")
        ax.set_xticks(list(xs), [n.replace("general_", "g_").replace("coding_", "c_") for n in names],
                      rotation=45, fontsize=6)
        ax.set_ylabel("success rate")
        ax.legend(fontsize=7)
    put("specialists_vs_sft", vs_sft if gains else None, "no specialist and SFT evaluations")

    tokens = {d: t for d, t in by[3].figures.get("tokens", {}).items() if any(v is not None for v in t)}

    def spent(ax):
        for d, t in tokens.items():
            ax.plot(EFFORTS, [float("nan") if v is None else v for v in t], marker="o", label=d)
        ax.set_xlabel("effort")
        ax.set_ylabel("policy tokens per episode")
        ax.legend(fontsize=7)
    put("tokens_by_effort", spent if tokens else None, "no specialist reports its token use")

    retention = by[4].figures.get("retention", {})
    if any(v is not None for v in retention.values()):
        got["teacher_retention"] = retention_heatmap(retention, out / "teacher_retention.png")
    else:
        got["teacher_retention"] = "not measured: no student and teacher evaluations"

    q = by[5].figures

    def quant(ax):
        labels = ["QAT bf16", "QAT MXFP4", "PTQ bf16", "PTQ MXFP4"]
        ax.bar(labels, [q["qat"]["bf16"], q["qat"]["mxfp4"], q["ptq"]["bf16"], q["ptq"]["mxfp4"]],
               color=["C0", "C0", "C1", "C1"])
        ax.set_ylabel(q["metric"])
    put("quantization", quant if q else None, "no QAT / PTQ / bf16 figures")

    acceptance = by[6].figures.get("acceptance", {})

    def accept(ax):
        ks = sorted(acceptance)
        ax.plot(ks, [acceptance[k] for k in ks], marker="o")
        ax.axhline(C.ACCEPTANCE_AT_4, color="red", lw=0.6, ls="--")
        ax.set_xlabel("draft length")
        ax.set_ylabel("mean acceptance length")
    put("acceptance", accept if acceptance else None, "the draft model reports no acceptance lengths")
    return got
