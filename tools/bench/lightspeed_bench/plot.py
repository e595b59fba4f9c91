"""The Pareto plot: per-user speed (x) against per-GPU throughput (y), one curve per run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402

_Y_KEYS = {"output": ("output_tokens_per_min_per_gpu", "output tokens / min / GPU"),
           "total": ("total_tokens_per_min_per_gpu", "total (input + output) tokens / min / GPU")}


def run_label(run: dict[str, Any]) -> str:
    return run.get("label") or f"{run.get('model', '?')} @ {run.get('server', {}).get('base_url', '?')}"


def plot_runs(runs: list[dict[str, Any]], out: str | Path, y: str = "output",
              floor: float | None = None, title: str | None = None) -> Path:
    """Overlay the runs' levels as curves, each point labelled with its concurrency."""
    y_key, y_label = _Y_KEYS[y]
    fig, ax = plt.subplots(figsize=(9, 6), dpi=120)
    for run in runs:
        points = sorted(
            (lvl["concurrency"], lvl["tokens_per_s_per_user"], lvl[y_key])
            for lvl in run["levels"] if lvl.get("tokens_per_s_per_user") and lvl.get(y_key)
        )
        if not points:
            continue
        xs, ys = [p[1] for p in points], [p[2] for p in points]
        (line,) = ax.plot(xs, ys, marker="o", linewidth=2, markersize=7, label=run_label(run))
        for conc, x, yv in points:
            ax.annotate(f"c={conc}", (x, yv), textcoords="offset points", xytext=(6, 6),
                        fontsize=9, color=line.get_color())
    if floor:
        ax.axvline(floor, color="grey", linestyle="--", linewidth=1)
        ax.annotate(f"floor {floor:g} tok/s/user", (floor, 0.02), xycoords=("data", "axes fraction"),
                    xytext=(4, 0), textcoords="offset points", fontsize=9, color="grey")
    ax.set_xlabel("tokens / s / user  (1000 / mean TPOT ms)", fontsize=11)
    ax.set_ylabel(y_label, fontsize=11)
    ax.set_title(title or "Agentic workload: throughput vs per-user speed", fontsize=12)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.ticklabel_format(axis="y", style="plain")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=9, framealpha=0.9)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
