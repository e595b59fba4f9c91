"""Gateway figures on this machine: `lightspeed serve` start-up, TTFT and tokens/s of one short chat
request, and the gateway process's CPU cost per streamed token (with a py-spy profile of where it goes).

    .venv/bin/python gateway/benchmarks/serve_figures.py --out bench/results/gateway_<date>_cpu.md

The server runs the real engine (default model, CPU). The engine core is a child process, so the
CPU time of the server process itself is the gateway's cost: HTTP, chat template, the AsyncLLM
client (ZMQ, incremental detokenisation, stop strings), parsers, SSE encoding.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

READY = re.compile(r"Lightspeed ready in [0-9.]+ s: (http://\S+)")
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def start(args: list[str]) -> tuple[subprocess.Popen, str, float, list[str]]:
    exe = Path(sys.executable).with_name("lightspeed")
    began = time.monotonic()
    proc = subprocess.Popen([str(exe), "serve", "--port", "0", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    url = None
    for line in proc.stdout:
        lines.append(line)
        match = READY.search(line)
        if match:
            url = match.group(1)
            break
    if url is None:
        raise RuntimeError("server did not start:\n" + "".join(lines[-40:]))
    ready_s = time.monotonic() - began
    threading.Thread(target=lambda: [lines.append(x) for x in proc.stdout], daemon=True).start()
    return proc, url, ready_s, lines


def stream_chat(url: str, content: str, max_tokens: int, ignore_eos: bool) -> dict:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos}
    sent = time.monotonic()
    first = last = None
    chunks = 0
    usage = None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            payload = json.loads(line[6:])
            if payload.get("usage"):
                usage = payload["usage"]
            if payload["choices"] and payload["choices"][0]["delta"].get("content"):
                now = time.monotonic()
                first = first or now
                last = now
                chunks += 1
    tokens = usage["completion_tokens"]
    return {"ttft_s": first - sent, "e2e_s": last - sent, "tokens": tokens, "chunks": chunks,
            "decode_tok_s": (tokens - 1) / (last - first) if tokens > 1 and last > first else float("nan"),
            "e2e_tok_s": tokens / (last - sent)}


def profile(pid: int, seconds: int, out: Path) -> list[tuple[str, float]]:
    """py-spy samples of the server's threads; the top functions by own time (fraction of samples)."""
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(pyspy).exists():
        return []
    raw = out.with_suffix(".txt")
    subprocess.run([pyspy, "record", "-p", str(pid), "-d", str(seconds), "-r", "200", "-f", "raw", "-o", str(raw),
                    "--nonblocking"], check=False, capture_output=True)
    if not raw.exists():
        return []
    own: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not frames or not count.isdigit():
            continue
        leaf = frames[-1]
        if "select" in leaf or "epoll" in leaf or "poll (" in leaf or "_run_once" in leaf and len(frames) < 3:
            continue  # the event loop waiting: idle, not cost
        own[leaf] = own.get(leaf, 0) + int(count)
        total += int(count)
    raw.unlink()
    return [(name, n / total) for name, n in sorted(own.items(), key=lambda kv: -kv[1])[:12]] if total else []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cpu-tokens", type=int, default=256, help="tokens streamed for the CPU-cost figure")
    args = parser.parse_args()
    serve_args = ["--max-model-len", "2048"]
    proc, url, ready_s, lines = start(serve_args)
    try:
        stream_chat(url, "Hi!", 4, False)  # warm-up: first-request costs (grammar, allocator)
        short = [stream_chat(url, "What is the capital of France? Answer in one sentence.", 32, False)
                 for _ in range(3)]
        idle_before = cpu_seconds(proc.pid)
        time.sleep(5)
        idle_rate = (cpu_seconds(proc.pid) - idle_before) / 5
        before, wall = cpu_seconds(proc.pid), time.monotonic()
        long = stream_chat(url, "Write a long story about a lighthouse keeper.", args.cpu_tokens, True)
        used = cpu_seconds(proc.pid) - before
        wall = time.monotonic() - wall
        gateway_cpu_per_token = (used - idle_rate * wall) / long["tokens"]
        spy: list[tuple[str, float]] = []
        holder: dict = {}
        worker = threading.Thread(target=lambda: holder.update(r=stream_chat(url, "Tell me about the sea.",
                                                                             args.cpu_tokens, True)))
        worker.start()
        time.sleep(1.0)
        spy = profile(proc.pid, max(3, int(long["e2e_s"] * 0.6)), args.out)
        worker.join()
    finally:
        proc.terminate()
        proc.wait(30)
    median = sorted(short, key=lambda r: r["ttft_s"])[1]
    lines_out = [
        f"# Gateway figures, CPU ({datetime.date.today().isoformat()})",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"load average at the end {os.getloadavg()[0]:.1f} (other jobs share these cores).",
        f"Model: default (SmolLM2-135M-Instruct GGUF, fp32 on CPU). Server: `lightspeed serve {' '.join(serve_args)}`.",
        "Produced by `gateway/benchmarks/serve_figures.py`; every number below is measured by that run.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| `lightspeed serve` start to ready line (venv installed, model on disk) | {ready_s:.1f} s |",
        f"| short chat (32 tokens max, greedy, streamed): TTFT, median of 3 | {median['ttft_s'] * 1000:.0f} ms |",
        f"| same request: decode tokens/s (after the first token) | {median['decode_tok_s']:.1f} tok/s |",
        f"| same request: tokens / end-to-end seconds ({median['tokens']} tokens) | {median['e2e_tok_s']:.1f} tok/s |",
        f"| gateway process CPU per streamed token ({long['tokens']} tokens, idle {idle_rate * 1000:.1f} ms/s "
        f"subtracted) | {gateway_cpu_per_token * 1e6:.0f} µs |",
        f"| gateway CPU share of one core while streaming one request at {long['tokens'] / long['e2e_s']:.1f} "
        f"tok/s | {100 * used / wall:.1f} % |",
        "",
        "Short-request runs (TTFT ms / decode tok/s / tokens): "
        + ", ".join(f"{r['ttft_s'] * 1000:.0f} / {r['decode_tok_s']:.1f} / {r['tokens']}" for r in short),
        "",
    ]
    if spy:
        lines_out += ["## Where the gateway's CPU goes (py-spy, own time, busy samples only)", "",
                      "| share | function |", "|---|---|"]
        lines_out += [f"| {share * 100:.1f} % | `{name}` |" for name, share in spy]
        lines_out.append("")
    args.out.write_text("\n".join(lines_out))
    print("\n".join(lines_out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
