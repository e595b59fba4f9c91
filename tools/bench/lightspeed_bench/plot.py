"""The Pareto plot: per-user speed (x) against throughput (y, per GPU on GPU runs), one curve per run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402

from .report import run_on_gpu

_Y_KEYS = {"output": ("output_tokens_per_min_per_gpu", "output tokens / min"),
           "total": ("total_tokens_per_min_per_gpu", "total (input + output) tokens / min")}


def run_label(run: dict[str, Any]) -> str:
    return run.get("label") or f"{run.get('model', '?')} @ {run.get('server', {}).get('base_url', '?')}"


def run_labels(runs: list[dict[str, Any]]) -> list[str]:
    """One legend label per run, distinct: runs sharing a label get their date-time (and commit,
    then a number) appended, so overlaid runs of the same server stay apart."""
    labels = [run_label(run) for run in runs]
    for detail in (lambda r: str(r.get("date", ""))[:16].replace("T", " "),
                   lambda r: str(r.get("git_commit", ""))[:10],
                   lambda r: ""):
        counts = {label: labels.count(label) for label in labels}
        if all(count == 1 for count in counts.values()):
            break
        labels = [f"{label} ({detail(run)})" if counts[label] > 1 and detail(run) else label
                  for label, run in zip(labels, runs, strict=True)]
    seen: dict[str, int] = {}
    for i, label in enumerate(labels):  # still equal (same date and commit): number them
        seen[label] = seen.get(label, 0) + 1
        if labels.count(label) > 1:
            labels[i] = f"{label} #{seen[label]}"
    return labels


def y_label(runs: list[dict[str, Any]], y: str) -> str:
    """The y axis: 'per GPU' only when every run is a GPU run."""
    base = _Y_KEYS[y][1]
    on_gpu = [run_on_gpu(run) for run in runs]
    if all(on_gpu):
        return base + " / GPU"
    return base if not any(on_gpu) else base + " (per GPU for GPU runs)"


def workload_caption(run: dict[str, Any]) -> str:
    """One line describing a run's workload, for the foot of the plot."""
    wl = run.get("workload") or {}
    spec = wl.get("spec")
    if spec:
        return (f"agentic: system {spec['system_prompt_tokens']} + first turn {spec['first_turn_tokens']} tok, "
                f"+{spec['turn_tokens']} tok/turn, {spec['turns']} turns, {spec['output_tokens']} output tok")
    if wl.get("mode") == "random":
        return f"random: {wl.get('input_tokens')} input tok, {wl.get('output_tokens')} output tok"
    return f"{wl.get('mode', '?')}: {wl.get('trace', '')}"


def plot_runs(runs: list[dict[str, Any]], out: str | Path, y: str = "output",
              floor: float | None = None, title: str | None = None) -> Path:
    """Overlay the runs' levels as curves, each point labelled with its concurrency."""
    y_key = _Y_KEYS[y][0]
    fig, ax = plt.subplots(figsize=(9, 6), dpi=120)
    x_max = y_max = 0.0
    for run, label in zip(runs, run_labels(runs), strict=True):
        points = sorted(
            (lvl["concurrency"], lvl["tokens_per_s_per_user"], lvl[y_key])
            for lvl in run["levels"] if lvl.get("tokens_per_s_per_user") and lvl.get(y_key)
        )
        if not points:
            continue
        xs, ys = [p[1] for p in points], [p[2] for p in points]
        x_max, y_max = max(x_max, *xs), max(y_max, *ys)
        (line,) = ax.plot(xs, ys, marker="o", linewidth=2, markersize=7, label=label)
        for conc, x, yv in points:
            ax.annotate(f"c={conc}", (x, yv), textcoords="offset points", xytext=(6, 6),
                        fontsize=9, color=line.get_color())
    if floor:
        ax.axvline(floor, color="grey", linestyle="--", linewidth=1)
        ax.annotate(f"floor {floor:g} tok/s/user", (floor, 0.02), xycoords=("data", "axes fraction"),
                    xytext=(4, 0), textcoords="offset points", fontsize=9, color="grey")
    ax.set_xlabel("tokens / s / user  (1000 / mean TPOT ms)", fontsize=11)
    ax.set_ylabel(y_label(runs, y), fontsize=11)
    ax.set_title(title or "Agentic workload: throughput vs per-user speed", fontsize=12)
    captions = {workload_caption(run) for run in runs}
    caption = captions.pop() if len(captions) == 1 else "workloads differ: see each run's JSON"
    if len(runs) == 1:
        caption += f"; {runs[0].get('date', '')}, commit {str(runs[0].get('git_commit', ''))[:12]}"
    if caption:
        fig.text(0.01, 0.01, caption, fontsize=8, color="dimgrey")
    # Headroom so the top/right points and their labels stay inside the axes.
    ax.set_xlim(0, max(x_max, floor or 0.0) * 1.18 or 1.0)
    ax.set_ylim(0, y_max * 1.15 or 1.0)
    ax.grid(True, alpha=0.3)
    ax.ticklabel_format(axis="y", style="plain")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=9, framealpha=0.9)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
