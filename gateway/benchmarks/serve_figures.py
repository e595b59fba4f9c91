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


def start(args: list[str], fake: bool = False) -> tuple[subprocess.Popen, str, float, list[str]]:
    """`lightspeed serve` (or, with fake=True, the same CLI and app over the scripted test engine)."""
    if fake:
        tests = Path(__file__).resolve().parents[1] / "tests"
        cmd = [sys.executable, str(tests / "gateway_fake_server.py")]
        env = {**os.environ, "PYTHONPATH": str(tests), "FAKE_TOKEN_DELAY_S": "0"}
    else:
        cmd, env = [str(Path(sys.executable).with_name("lightspeed")), "serve"], None
    began = time.monotonic()
    proc = subprocess.Popen([*cmd, "--port", "0", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
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


def concurrent_streams(url: str, streams: int, tokens: int) -> list[dict]:
    results: list[dict] = []
    threads = [threading.Thread(target=lambda i=i: results.append(
        stream_chat(url, f"Story number {i}: write about the sea.", tokens, True))) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def profile(pid: int, seconds: int, out: Path) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """py-spy samples of the server's threads; the top functions by own time (fraction of samples)."""
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(pyspy).exists():
        return [], []
    raw = out.with_suffix(".txt")
    subprocess.run([pyspy, "record", "-p", str(pid), "-d", str(seconds), "-r", "200", "-f", "raw", "-o", str(raw),
                    "--nonblocking"], check=False, capture_output=True)
    if not raw.exists():
        return [], []
    own: dict[str, int] = {}
    packages: dict[str, int] = {}
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
        package = _package_of(leaf)
        packages[package] = packages.get(package, 0) + int(count)
        total += int(count)
    raw.unlink()
    if not total:
        return [], []
    top = [(name, n / total) for name, n in sorted(own.items(), key=lambda kv: -kv[1])[:12]]
    return top, [(name, n / total) for name, n in sorted(packages.items(), key=lambda kv: -kv[1])]


def _package_of(frame: str) -> str:
    """`func (path/to/file.py:12)` -> the top-level package of the file (or the stdlib module)."""
    match = re.search(r"\(([^:)]+)", frame)
    path = match.group(1) if match else frame
    parts = [p for p in path.split("/") if p]
    for anchor in ("lightspeed_gateway", "lightspeed"):
        if anchor in parts:
            return anchor
    for marker in ("site-packages", "python3"):
        for i, part in enumerate(parts[:-1]):
            if part.startswith(marker):
                return parts[i + 1].removesuffix(".py")
    if len(parts) > 1 and not path.startswith("/"):
        return parts[0]  # py-spy's short form: asyncio/runners.py
    return parts[-1].removesuffix(".py") if parts else path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--streams", type=int, default=8, help="concurrent streams for the CPU-cost figure")
    parser.add_argument("--stream-tokens", type=int, default=32, help="tokens per stream, real engine")
    parser.add_argument("--fast-tokens", type=int, default=512, help="tokens per stream, scripted engine")
    args = parser.parse_args()
    serve_args = ["--max-model-len", "2048"]
    proc, url, ready_s, lines = start(serve_args)
    try:
        stream_chat(url, "Hi!", 4, False)  # warm-up: first-request costs (allocator, caches)
        short = [stream_chat(url, "What is the capital of France? Answer in one sentence.", 32, True)
                 for _ in range(3)]
        before, wall = cpu_seconds(proc.pid), time.monotonic()
        batch = concurrent_streams(url, args.streams, args.stream_tokens)
        real_used, real_wall = cpu_seconds(proc.pid) - before, time.monotonic() - wall
        real_tokens = sum(r["tokens"] for r in batch)
    finally:
        proc.terminate()
        proc.wait(30)
    # The gateway layer alone, at a token rate the CPU engine cannot reach: the same CLI and app over
    # the scripted test engine with no per-token delay (its tokenizer.decode per token stands in for
    # the AsyncLLM client's incremental detokenisation).
    proc, url, _, _ = start(serve_args, fake=True)
    try:
        concurrent_streams(url, 2, 16)
        idle_before = cpu_seconds(proc.pid)
        time.sleep(3)
        idle_rate = (cpu_seconds(proc.pid) - idle_before) / 3
        before, wall = cpu_seconds(proc.pid), time.monotonic()
        fast = concurrent_streams(url, args.streams, args.fast_tokens)
        used, wall = cpu_seconds(proc.pid) - before, time.monotonic() - wall
        tokens = sum(r["tokens"] for r in fast)
        gateway_cpu_per_token = (used - idle_rate * wall) / tokens
        profiling = threading.Event()

        def keep_busy() -> None:
            while not profiling.is_set():
                concurrent_streams(url, args.streams, args.fast_tokens)

        worker = threading.Thread(target=keep_busy)
        worker.start()
        time.sleep(0.5)
        spy = profile(proc.pid, 8, args.out)
        profiling.set()
        worker.join()
    finally:
        proc.terminate()
        proc.wait(30)
    median = sorted(short, key=lambda r: r["ttft_s"])[1]
    top, packages = spy
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
        f"| short chat (32 tokens, greedy, streamed, ignore_eos): TTFT, median of 3 | {median['ttft_s'] * 1000:.0f} ms |",
        f"| same request: decode tokens/s (after the first token) | {median['decode_tok_s']:.1f} tok/s |",
        f"| same request: tokens / end-to-end seconds ({median['tokens']} tokens) | {median['e2e_tok_s']:.1f} tok/s |",
        f"| real engine, {args.streams} concurrent streams: aggregate tokens/s ({real_tokens} tokens) | "
        f"{real_tokens / real_wall:.1f} tok/s |",
        f"| real engine, same run: server-process CPU (gateway + AsyncLLM client; the core is a child) per "
        f"token, idle cost included | {real_used / real_tokens * 1e6:.0f} µs |",
        f"| **gateway CPU per streamed token** (scripted engine, {args.streams} streams x {args.fast_tokens} tokens, "
        f"{tokens / wall:.0f} tok/s, idle {idle_rate * 1000:.1f} ms/s subtracted) | "
        f"**{gateway_cpu_per_token * 1e6:.0f} µs** |",
        f"| same run: server-process CPU share of one core | {100 * used / wall:.0f} % |",
        "",
        "Short-request runs (TTFT ms / decode tok/s / tokens): "
        + ", ".join(f"{r['ttft_s'] * 1000:.0f} / {r['decode_tok_s']:.1f} / {r['tokens']}" for r in short),
        "",
    ]
    if top:
        lines_out += ["## Where the gateway's CPU goes (py-spy, scripted-engine run, busy samples)", "",
                      "By package of the running frame (`gateway_fake_engine` = the scripted engine standing in for the "
                      "AsyncLLM client; `Runner.run` is uvloop's C event loop, which py-spy sees as one frame):", "",
                      "| share | package |", "|---|---|"]
        lines_out += [f"| {share * 100:.1f} % | `{name}` |" for name, share in packages[:10]]
        lines_out += ["", "Top functions by own time:", "", "| share | function |", "|---|---|"]
        lines_out += [f"| {share * 100:.1f} % | `{name}` |" for name, share in top]
        lines_out.append("")
    args.out.write_text("\n".join(lines_out))
    print("\n".join(lines_out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
