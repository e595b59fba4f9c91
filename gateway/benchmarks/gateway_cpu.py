"""Gateway CPU per streamed token at 1 and 128 concurrent streams, over the real AsyncLLM client.

    .venv/bin/python gateway/benchmarks/gateway_cpu.py --out-dir bench/results   # gateway_cpu_<UTC date-time>_cpu.{json,md}

`lightspeed serve` (default model's tokenizer) runs with `scripted_core.py` as its engine core: the
real ZMQ protocol and AsyncLLM client, a token for every running request every 10 ms (a GPU's
decode step), no model. So the server process does exactly its serving work at a GPU's token
rate: HTTP, the AsyncLLM client (ZMQ, incremental detokenisation of real text, stop strings),
parsers, SSE. Its CPU time (utime + stime from /proc; the core is a child process) per token is
the figure; flat means the cost at 128 streams is no higher than at 1. A second table measures
chat rendering of a long agent session: the cost of one more turn, with and without the render cache.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).parent
READY = re.compile(r"Lightspeed ready in [0-9.]+ s: (http://\S+)")
TICKS = os.sysconf("SC_CLK_TCK")
USAGE = re.compile(rb'"completion_tokens":([0-9]+)')
SAMPLE = ("The naïve café owner in 東京 said: “ship it” 🚀. Then we refactored the parser, fixed three "
          "flaky tests, and wrote `def main() -> int:` with a docstring. Über-fast inference — 128 streams! ")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def start(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, str(HERE / "scripted_server.py"), "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **env})
    lines = []
    for line in proc.stdout:
        lines.append(line)
        match = READY.search(line)
        if match:
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, match.group(1)
    raise RuntimeError("server did not start:\n" + "".join(lines[-40:]))


async def one_stream(host: str, port: int, i: int, tokens: int) -> int:
    """One streamed chat completion over a raw socket (an HTTP client that parses every SSE line
    would cost more CPU than the server it measures); returns the completion tokens of its usage."""
    body = json.dumps({"messages": [{"role": "user", "content": f"Stream {i}: tell a story."}], "max_tokens": tokens,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}).encode()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (host.encode(), len(body), body))
    tail = b""
    while b"data: [DONE]" not in tail:
        chunk = await reader.read(65536)
        if not chunk:
            raise RuntimeError("stream ended early: " + tail[-300:].decode(errors="replace"))
        tail = (tail + chunk)[-4096:]
    writer.close()
    return int(USAGE.findall(tail)[-1])


async def run_streams(url: str, streams: int, tokens: int) -> int:
    host, port = url.removeprefix("http://").split(":")
    done = await asyncio.gather(*(one_stream(host, int(port), i, tokens) for i in range(streams)))
    return sum(done)


def measure(url: str, pid: int, streams: int, tokens: int) -> dict:
    asyncio.run(run_streams(url, min(streams, 8), 8))  # warm-up: connections, first-use costs
    idle_before = cpu_seconds(pid)
    time.sleep(2)
    idle_rate = (cpu_seconds(pid) - idle_before) / 2
    before, wall = cpu_seconds(pid), time.monotonic()
    total = asyncio.run(run_streams(url, streams, tokens))
    wall = time.monotonic() - wall
    used = cpu_seconds(pid) - before - idle_rate * wall
    return {"streams": streams, "tokens_per_stream": tokens, "tokens": total, "wall_s": wall,
            "tok_s": total / wall, "gateway_cpu_us_per_token": used / total * 1e6,
            "gateway_cpu_share": used / wall, "idle_cpu_ms_per_s": idle_rate * 1000}


def render_costs(turns: int) -> list[dict]:
    """Rendering turn k of a long agent session: cold (from scratch) vs with the render cache."""
    from lightspeed import default_model, load_tokenizer
    from lightspeed_gateway.template import ChatRenderer

    tokenizer = load_tokenizer(default_model())
    session = _session(turns)
    warm, cold = ChatRenderer(tokenizer), ChatRenderer(tokenizer, cache_tokens=0)
    rows = []
    for end in range(2, len(session), 2):
        started = time.perf_counter()
        prompt = warm.render(session[:end])
        warm_s = time.perf_counter() - started
        if end % (turns // 4 * 2 or 2) == 0 or end == len(session) - 1:
            started = time.perf_counter()
            cold.render(session[:end])
            rows.append({"turn": end // 2, "prompt_tokens": len(prompt.token_ids), "warm_ms": warm_s * 1000,
                         "cold_ms": (time.perf_counter() - started) * 1000})
    warm.close()
    cold.close()
    return rows


def _session(turns: int, tag: str = "") -> list:
    from lightspeed_gateway.openai.protocol import ChatMessage

    session = [ChatMessage(role="system", content=f"You are a coding agent{tag}. Follow the rules. " * 200)]
    for i in range(turns):
        session.append(ChatMessage(role="user", content=f"Tool output {i}: " + "lorem ipsum dolor sit amet " * 60))
        session.append(ChatMessage(role="assistant", content=f"Step {i} done; next I will edit file_{i}.py. " * 6))
    return session


_WORKER_RENDERER = None


def _worker_init() -> None:
    global _WORKER_RENDERER  # one renderer per worker process (its tokenizer loads once)
    from lightspeed import default_model, load_tokenizer
    from lightspeed_gateway.template import ChatRenderer

    _WORKER_RENDERER = ChatRenderer(load_tokenizer(default_model()), cache_tokens=0)


def _worker_render(messages: list) -> int:
    return len(_WORKER_RENDERER.render(messages).token_ids)


def offload_costs(num_renders: int, turns: int) -> list[dict]:
    """Where cold renders (new long conversations) should run: event-loop lag and wall time with
    `num_renders` concurrent renders on the loop, in the renderer's worker threads, or in a
    process pool (one worker per core), while a 1 ms ticker measures the loop's lag."""
    from concurrent.futures import ProcessPoolExecutor

    from lightspeed import default_model, load_tokenizer
    from lightspeed_gateway.template import ChatRenderer

    sessions = [_session(turns, f" #{i}") for i in range(num_renders)]
    threads = ChatRenderer(load_tokenizer(default_model()), cache_tokens=0)
    processes = ProcessPoolExecutor(max_workers=os.cpu_count(), initializer=_worker_init)
    list(processes.map(_worker_render, [sessions[0][:2]] * os.cpu_count()))  # start and warm the workers

    async def run(mode: str) -> dict:
        loop = asyncio.get_running_loop()
        lags: list[float] = []
        done = asyncio.Event()

        async def ticker() -> None:
            while not done.is_set():
                before = time.perf_counter()
                await asyncio.sleep(0.001)
                lags.append(time.perf_counter() - before - 0.001)

        async def render(messages: list) -> None:
            if mode == "event loop":
                threads.render(messages)
                await asyncio.sleep(0)
            elif mode == "thread pool":
                await threads.render_async(messages)
            else:
                await loop.run_in_executor(processes, _worker_render, messages)

        tick = asyncio.ensure_future(ticker())
        await asyncio.sleep(0.05)
        started = time.perf_counter()
        await asyncio.gather(*(render(m) for m in sessions))
        wall = time.perf_counter() - started
        done.set()
        await tick
        lags.sort()
        return {"mode": mode, "renders": num_renders, "wall_ms": wall * 1000,
                "lag_p50_ms": lags[len(lags) // 2] * 1000, "lag_p99_ms": lags[int(len(lags) * 0.99)] * 1000,
                "lag_max_ms": lags[-1] * 1000}

    try:
        return [asyncio.run(run(mode)) for mode in ("event loop", "thread pool", "process pool")]
    finally:
        processes.shutdown()
        threads.close()


def commit() -> str:
    """The commit of the gateway code under test (the checkout `lightspeed_gateway` is imported from)."""
    import lightspeed_gateway

    where = Path(lightspeed_gateway.__file__).parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=where,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=where, check=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=Path("bench/results"),
                        help="writes gateway_cpu_<YYYY-MM-DD_HHMMSS>_cpu[_LABEL].json and .md here")
    parser.add_argument("--label", default="", help="suffix of the file name (e.g. the branch measured)")
    parser.add_argument("--streams", default="1:1000,128:128", help="STREAMS:TOKENS_PER_STREAM, comma-separated")
    parser.add_argument("--step-s", type=float, default=0.01, help="the scripted core's step time")
    parser.add_argument("--repeat", type=int, default=3, help="runs per stream count (the median is reported)")
    parser.add_argument("--turns", type=int, default=40, help="turns of the rendering session (0: skip)")
    parser.add_argument("--offload-renders", type=int, default=8, help="concurrent cold renders, offload table")
    args = parser.parse_args()
    from lightspeed import default_model, load_tokenizer

    folder = Path(tempfile.mkdtemp(prefix="gateway-cpu-"))
    ids = load_tokenizer(default_model()).encode(SAMPLE * 4, add_special_tokens=False)
    (folder / "tokens.json").write_text(json.dumps(ids))
    serve_args = ["--max-num-seqs", "256", "--max-model-len", "8192"]
    proc, url = start(serve_args, {"SCRIPTED_CORE_TOKENS": str(folder / "tokens.json"),
                                   "SCRIPTED_CORE_STEP_S": str(args.step_s)})
    try:
        runs = [[measure(url, proc.pid, streams, tokens) for _ in range(args.repeat)] for streams, tokens in
                (map(int, item.split(":")) for item in args.streams.split(","))]
        # The median run per stream count (shared cores: other jobs come and go).
        rows = [sorted(r, key=lambda x: x["gateway_cpu_us_per_token"])[len(r) // 2] for r in runs]
    finally:
        proc.terminate()
        proc.wait(30)
    rendering = render_costs(args.turns) if args.turns else []
    offload = offload_costs(args.offload_renders, args.turns) if args.turns else []
    stamp = datetime.datetime.now(datetime.timezone.utc)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    args.out = args.out_dir / f"gateway_cpu_{stamp:%Y-%m-%d_%H%M%S}_cpu{'_' + args.label if args.label else ''}"
    result = {"date": stamp.isoformat(timespec="seconds"), "commit": commit(), "device": "cpu",
              "machine": f"{platform.machine()}, {os.cpu_count()} cores", "load_average": os.getloadavg()[0],
              "server_args": serve_args, "step_s": args.step_s, "streaming": rows, "streaming_runs": runs, "rendering": rendering,
              "offload": offload}
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    lines = [f"# Gateway CPU per token, CPU ({stamp:%Y-%m-%d %H:%M} UTC, commit {result['commit']})", "",
             f"Machine: {result['machine']}, load average at the end {result['load_average']:.1f} (shared cores). "
             "Produced by `gateway/benchmarks/gateway_cpu.py`: streamed chat completions (ignore_eos) from "
             f"`scripted_core.py`, one token per stream every {args.step_s * 1000:.0f} ms, through the real "
             f"AsyncLLM client; median of {args.repeat} runs.", "",
             "| streams | tokens | tok/s | gateway CPU µs/token | gateway CPU share of a core |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['streams']} | {r['tokens']} | {r['tok_s']:.0f} | **{r['gateway_cpu_us_per_token']:.0f}** | "
              f"{100 * r['gateway_cpu_share']:.0f} % |" for r in rows]
    if rendering:
        lines += ["", f"Rendering turn k of a {args.turns}-turn agent session (SmolLM2 template and tokenizer): "
                  "with the render cache (turn k-1 rendered before) vs from scratch.", "",
                  "| turn | prompt tokens | with cache ms | from scratch ms |", "|---|---|---|---|"]
        lines += [f"| {r['turn']} | {r['prompt_tokens']} | {r['warm_ms']:.1f} | {r['cold_ms']:.1f} |" for r in rendering]
        lines += ["", f"Where rendering runs: {args.offload_renders} concurrent cold renders of {args.turns}-turn sessions "
                  "while a 1 ms asyncio ticker measures event-loop lag (process pool: one worker per core, "
                  "tokenizer loaded in each).", "",
                  "| mode | wall ms | loop lag p50 ms | p99 ms | max ms |", "|---|---|---|---|---|"]
        lines += [f"| {r['mode']} | {r['wall_ms']:.0f} | {r['lag_p50_ms']:.2f} | {r['lag_p99_ms']:.1f} | "
                  f"{r['lag_max_ms']:.1f} |" for r in offload]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
