"""Run files: one JSON (metadata, per-level figures, per-request records) and one CSV row per level."""

from __future__ import annotations

import csv
import datetime as dt
import json
import subprocess
from pathlib import Path
from typing import Any

# Columns of the CSV, in order: (column, key path into a level summary).
_CSV_FIELDS = [
    ("concurrency", ("concurrency",)),
    ("requests_measured", ("requests_measured",)),
    ("error_count", ("error_count",)),
    ("window_s", ("window_s",)),
    ("ttft_ms_p50", ("ttft_ms", "p50")), ("ttft_ms_p90", ("ttft_ms", "p90")), ("ttft_ms_p99", ("ttft_ms", "p99")),
    ("ttft_ms_first_turn_mean", ("ttft_ms_first_turn", "mean")),
    ("ttft_ms_later_turns_mean", ("ttft_ms_later_turns", "mean")),
    ("tpot_ms_mean", ("tpot_ms", "mean")), ("tpot_ms_p50", ("tpot_ms", "p50")),
    ("tpot_ms_p90", ("tpot_ms", "p90")), ("tpot_ms_p99", ("tpot_ms", "p99")),
    ("itl_ms_p50", ("itl_ms", "p50")), ("itl_ms_p90", ("itl_ms", "p90")), ("itl_ms_p99", ("itl_ms", "p99")),
    ("tokens_per_s_per_user", ("tokens_per_s_per_user",)),
    ("tokens_per_s_per_user_p10", ("tokens_per_s_per_user_p10",)),
    ("output_tokens_per_min_per_gpu", ("output_tokens_per_min_per_gpu",)),
    ("total_tokens_per_min_per_gpu", ("total_tokens_per_min_per_gpu",)),
    ("request_throughput_per_s", ("request_throughput_per_s",)),
    ("input_tokens", ("input_tokens",)), ("output_tokens", ("output_tokens",)),
    ("cached_fraction", ("cached_fraction",)),
    ("server_cached_fraction", ("server_cache", "cached_fraction")),
    ("ideal_cached_fraction", ("ideal_cached_fraction",)),
    ("ideal_cached_fraction_paged", ("ideal_cached_fraction_paged",)),
    ("spec_acceptance_length", ("server_cache", "spec_acceptance_length")),
    ("spec_draft_acceptance_rate", ("server_cache", "spec_draft_acceptance_rate")),
    ("cancelled_at_deadline", ("cancelled_at_deadline",)),
    ("duration_limited", ("duration_limited",)),
]


def git_commit(where: Path | None = None) -> str:
    """HEAD of the repository the tool runs from (with '+dirty' when the tree differs), else 'unknown'."""
    try:
        cwd = str(where or Path.cwd())
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _dig(summary: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = summary
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def write_run(run: dict[str, Any], stem: Path) -> tuple[Path, Path]:
    """Write stem.json and stem.csv; returns both paths."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    json_path, csv_path = stem.with_suffix(".json"), stem.with_suffix(".csv")
    json_path.write_text(json.dumps(run, indent=1, default=str) + "\n")
    meta = {"label": run["label"], "server": run["server"]["base_url"], "model": run["model"],
            "date": run["date"], "git_commit": run["git_commit"], "flags": json.dumps(run["flags"])}
    with csv_path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow([*meta, *(name for name, _ in _CSV_FIELDS)])
        for level in run["levels"]:
            writer.writerow([*meta.values(), *(_dig(level, path) for _, path in _CSV_FIELDS)])
    return json_path, csv_path


def load_run(path: str | Path) -> dict[str, Any]:
    run = json.loads(Path(path).read_text())
    if "levels" not in run:
        raise ValueError(f"{path}: not a lightspeed-bench run file (no 'levels')")
    return run


def run_on_gpu(run: dict[str, Any]) -> bool:
    """Whether the server ran on a GPU: its reported device (Lightspeed's /version); servers that
    report none (vLLM's) are taken to run on GPUs."""
    device = run.get("device")
    if isinstance(device, str):
        return device.startswith("cuda")
    return True


def format_table(levels: list[dict[str, Any]], per_gpu: bool = True) -> str:
    """A terminal summary of the levels, with each column's unit."""
    throughput = "out tok/min/GPU" if per_gpu else "out tok/min"
    head = (f"{'conc':>5} {'req':>5} {'err':>4} {'TTFT p50':>9} {'p99':>8} {'TPOT p50':>9} {'p99':>7} "
            f"{'tok/s/usr':>9} {'p10':>6} {throughput:>15} {'cached':>7} {'ideal':>6}")
    units = (f"{'':>5} {'':>5} {'':>4} {'(ms)':>9} {'(ms)':>8} {'(ms)':>9} {'(ms)':>7} "
             f"{'(tok/s)':>9} {'':>6} {'(tokens)':>15} {'(frac)':>7} {'(frac)':>6}")
    rows = [head, units]

    def num(v: Any, fmt: str) -> str:
        width = int(fmt.split(".")[0])
        return "-".rjust(width) if v is None else format(v, fmt)

    for s in levels:
        rows.append(
            f"{s['concurrency']:>5} {s['requests_measured']:>5} {s['error_count']:>4} "
            f"{num(s['ttft_ms']['p50'], '9.1f')} {num(s['ttft_ms']['p99'], '8.1f')} "
            f"{num(s['tpot_ms']['p50'], '9.2f')} {num(s['tpot_ms']['p99'], '7.2f')} "
            f"{num(s['tokens_per_s_per_user'], '9.1f')} {num(s['tokens_per_s_per_user_p10'], '6.1f')} "
            f"{num(s['output_tokens_per_min_per_gpu'], '15.0f')} {num(s['cached_fraction'], '7.3f')} "
            f"{num(s['ideal_cached_fraction'], '6.3f')}")
    return "\n".join(rows)


def format_errors(levels: list[dict[str, Any]]) -> list[str]:
    """One line per level with failed requests: how many of each kind, and what the server said."""
    lines = []
    for s in levels:
        if not s.get("error_count"):
            continue
        kinds = ", ".join(f"{count} {kind}" for kind, count in (s.get("errors") or {}).items())
        example = next(iter((s.get("error_examples") or {}).values()), "")
        lines.append(f"c={s['concurrency']}: {s['error_count']} failed ({kinds})" + (f": {example}" if example else ""))
    return lines
