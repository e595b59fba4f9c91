"""`lightspeed-bench agentic …` runs a sweep; `lightspeed-bench plot run.json … -o out.png` overlays runs."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import json
import secrets
import sys
from pathlib import Path
from typing import Any

import httpx

from . import __version__
from .client import RequestOptions
from .metrics import best_at_floor
from .plot import plot_runs
from .progress import Progress
from .report import format_errors, format_table, git_commit, load_run, run_on_gpu, utc_now, write_run
from .runner import SweepConfig, run_sweep
from .tokenizer import TokenCounter, choose_counter
from .workload import (
    CONTEXT_MARGIN,
    AgenticSpec,
    Conversation,
    agentic_conversations,
    calibrate,
    fit_agentic_spec,
    load_trace,
    random_conversations,
    system_prompt,
)


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("concurrency levels must be >= 1")
    return values


def _json_object(text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("--extra-body must be a JSON object")
    return value


def _add_agentic(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("agentic", help="run the multi-turn shared-prefix sweep against a server")
    srv = p.add_argument_group("server")
    srv.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root (no /v1)")
    srv.add_argument("--model", help="model name to send (default: first of /v1/models)")
    srv.add_argument("--api-key", help="sent as 'Authorization: Bearer …'")
    srv.add_argument("--endpoint", choices=("chat", "completions"), default="chat",
                     help="/v1/chat/completions (messages) or /v1/completions (rendered text prompt)")
    srv.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                     help="do not send ignore_eos (for servers that reject it)")
    srv.add_argument("--no-min-tokens", dest="min_tokens", action="store_false",
                     help="do not send min_tokens = max_tokens")
    srv.add_argument("--temperature", type=float, default=0.0)
    srv.add_argument("--extra-body", type=_json_object, default={}, help="JSON merged into every request")
    srv.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request")
    wl = p.add_argument_group("workload")
    wl.add_argument("--mode", choices=("agentic", "random", "trace"), default="agentic")
    wl.add_argument("--trace", help="JSONL trace to replay (implies --mode trace)")
    fits = "; the sizes you do not give shrink together when the server's max_model_len is shorter"
    wl.add_argument("--system-prompt-tokens", type=int, help="shared by every conversation (default 2000" + fits + ")")
    wl.add_argument("--first-turn-tokens", type=int, help="per-conversation repo context (default 30000)")
    wl.add_argument("--turn-tokens", type=int, help="tool result appended per later turn (default 800)")
    wl.add_argument("--turn-jitter", type=float, default=0.25, help="tool result length ± this fraction")
    wl.add_argument("--turns", type=int, help="requests per conversation (default 10)")
    wl.add_argument("--output-tokens", type=int, help="max_tokens (= min_tokens) per request (default 500)")
    wl.add_argument("--input-tokens", type=int, help="prompt length in --mode random (default 1000)")
    wl.add_argument("--num-conversations", type=int,
                    help="conversations per level (default: 2 x concurrency; random mode: requests)")
    wl.add_argument("--seed", type=int, default=0)
    wl.add_argument("--salt", help="tag on each first message that isolates this run from earlier ones "
                                   "in the server's cache (default: random); '' disables")
    wl.add_argument("--tokenizer", default="auto",
                    help="auto (server /tokenize, else crude estimate), server, crude, or a local "
                         "tokenizer directory / tokenizer.json")
    sw = p.add_argument_group("sweep")
    sw.add_argument("--concurrency", type=_int_list, default=(1, 2, 4, 8, 16, 32),
                    help="comma-separated levels, e.g. 1,2,4,8")
    sw.add_argument("--warmup-requests", type=int, help="per level, excluded (default: = concurrency)")
    sw.add_argument("--max-duration", type=float, default=300.0,
                    help="seconds per level after which no request starts")
    sw.add_argument("--drain-timeout", type=float,
                    help="seconds a level waits for in-flight requests after --max-duration before "
                         "cancelling them (default: --request-timeout)")
    sw.add_argument("--cache-page-size", type=int, default=0,
                    help="the server's KV page size: also report the ideal cached fraction in whole pages")
    sw.add_argument("--num-gpus", type=int, default=1, help="divides the per-GPU throughput")
    out = p.add_argument_group("output")
    out.add_argument("--output-dir", default="bench/results")
    out.add_argument("--name", help="file stem (default: agentic_<UTC date-time>)")
    out.add_argument("--label", help="legend label (default: model @ server)")
    out.add_argument("--no-plot", dest="plot", action="store_false")
    out.add_argument("--floor", type=float,
                     help="tokens/s/user floor: drawn on the plot; the run reports the best level whose "
                          "p10 user stays above it")
    out.add_argument("--no-progress", dest="progress", action="store_false")
    out.add_argument("--quiet", action="store_true", help="no table on stdout")


def _add_plot(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="overlay run JSON files on one Pareto plot")
    p.add_argument("runs", nargs="+", help="run JSON files written by 'agentic'")
    p.add_argument("-o", "--output", required=True, help="PNG path")
    p.add_argument("--y", choices=("output", "total"), default="output",
                   help="y axis: output or total (input + output) tokens/min/GPU")
    p.add_argument("--floor", type=float, help="draw a tokens/s/user floor")
    p.add_argument("--title")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lightspeed-bench", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_agentic(sub)
    _add_plot(sub)
    return parser


def _server_info(client: httpx.Client, model: str | None) -> tuple[str, dict[str, Any]]:
    info: dict[str, Any] = {"base_url": str(client.base_url).rstrip("/")}
    for path in ("/version", "/v1/models"):
        try:
            resp = client.get(path)
            if resp.status_code == 200:
                info[path.rsplit("/", 1)[-1]] = resp.json()
        except (httpx.HTTPError, ValueError):
            pass
    if model is None:
        models = (info.get("models") or {}).get("data") or []
        if not models:
            raise SystemExit("error: no --model given and the server's /v1/models lists none")
        model = models[0]["id"]
    return model, info


def probe_options(client: httpx.Client, options: RequestOptions) -> RequestOptions:
    """One 1-token request before the sweep: fail early when the server cannot serve, and drop
    the ignore_eos / min_tokens extensions when the server rejects them by name."""
    for _ in range(3):
        prompt = [{"role": "user", "content": "Say OK."}] if options.endpoint == "chat" else "Say OK."
        resp = client.post(options.path, json=options.body(prompt, 1))
        if resp.status_code == 200:
            return options
        detail = resp.text
        if resp.status_code in (400, 422) and options.ignore_eos and "ignore_eos" in detail:
            options = dataclasses.replace(options, ignore_eos=False)
        elif resp.status_code in (400, 422) and options.min_tokens and "min_tokens" in detail:
            options = dataclasses.replace(options, min_tokens=False)
        else:
            break
    raise SystemExit(f"error: probe request to {options.path} failed: HTTP {resp.status_code}: {detail[:300]}")


def server_max_model_len(server: dict[str, Any], model: str) -> int | None:
    """The context length the server reports for `model` in /v1/models (vLLM and Lightspeed do)."""
    for card in (server.get("models") or {}).get("data") or []:
        if card.get("id") == model and isinstance(card.get("max_model_len"), int):
            return card["max_model_len"]
    return None


def server_device(server: dict[str, Any]) -> str | None:
    """The device the server reports in /version (Lightspeed does), e.g. 'cpu' or 'cuda:0'."""
    device = (server.get("version") or {}).get("device")
    return device if isinstance(device, str) else None


def fit_workload(args: argparse.Namespace, max_model_len: int | None) -> tuple[AgenticSpec, str | None]:
    """The agentic spec: the sizes given, the rest defaults shrunk to the server's context; also
    settles --output-tokens / --input-tokens for the other modes."""
    names = ("system_prompt_tokens", "first_turn_tokens", "turn_tokens", "turns", "output_tokens")
    given = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    spec, note = fit_agentic_spec({**given, "turn_jitter": args.turn_jitter, "seed": args.seed},
                                  max_model_len if args.mode == "agentic" else None)
    if args.output_tokens is None:
        args.output_tokens = spec.output_tokens if args.mode == "agentic" else AgenticSpec.output_tokens
    if args.input_tokens is None:
        args.input_tokens = 1000
        if args.mode == "random" and max_model_len:  # leave room for the output and the template
            args.input_tokens = max(1, min(1000, int(max_model_len * CONTEXT_MARGIN) - args.output_tokens))
    return spec, note


def _workload(args: argparse.Namespace, counter: TokenCounter, spec: AgenticSpec) -> tuple[Any, dict[str, Any]]:
    """A level -> conversations factory, and the workload's description for the report."""
    desc: dict[str, Any] = {"mode": args.mode, "tokenizer": counter.name}
    if args.mode == "trace":
        trace = load_trace(args.trace, args.output_tokens)
        desc.update(trace=args.trace, conversations=len(trace))

        def from_trace(level_index: int, concurrency: int) -> list[Conversation]:
            count = args.num_conversations or len(trace)
            return [trace[i % len(trace)] for i in range(count)]
        return from_trace, desc
    cpt = calibrate(counter, args.seed)
    desc["chars_per_token"] = round(cpt, 3)
    if args.mode == "random":
        def randoms(level_index: int, concurrency: int) -> list[Conversation]:
            count = args.num_conversations or 4 * concurrency
            return random_conversations(args.input_tokens, args.output_tokens, level_index * 100000,
                                        count, args.seed, counter, cpt)
        desc.update(input_tokens=args.input_tokens, output_tokens=args.output_tokens)
        return randoms, desc
    system, system_tokens = system_prompt(spec, counter, cpt)
    desc.update(spec=spec.__dict__, system_prompt_tokens_measured=system_tokens)

    def agentic(level_index: int, concurrency: int) -> list[Conversation]:
        count = args.num_conversations or 2 * concurrency
        return agentic_conversations(spec, level_index * 100000, count, counter, cpt, system)
    return agentic, desc


def cmd_agentic(args: argparse.Namespace) -> int:
    if args.trace:
        args.mode = "trace"
    if args.mode == "trace" and not args.trace:
        raise SystemExit("error: --mode trace needs --trace FILE.jsonl")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    with httpx.Client(base_url=args.base_url, headers=headers, timeout=args.request_timeout) as sync_client:
        model, server = _server_info(sync_client, args.model)
        options = RequestOptions(model, args.endpoint, args.ignore_eos, args.min_tokens, args.temperature,
                                 args.extra_body)
        options = probe_options(sync_client, options)
    max_model_len = server_max_model_len(server, model)
    spec, note = fit_workload(args, max_model_len)
    if note:
        print(f"lightspeed-bench: {note}", file=sys.stderr, flush=True)
    counter = (TokenCounter("unused", len) if args.mode == "trace"
               else choose_counter(args.tokenizer, args.base_url, model, headers))
    factory, workload = _workload(args, counter, spec)
    workload.update(server_max_model_len=max_model_len, sizing_note=note)
    salt = secrets.token_hex(4) if args.salt is None else args.salt
    cfg = SweepConfig(
        concurrencies=args.concurrency, warmup_requests=args.warmup_requests,
        max_duration_s=args.max_duration, drain_timeout_s=args.drain_timeout,
        request_timeout_s=args.request_timeout, num_gpus=args.num_gpus,
        cache_page_size=args.cache_page_size, salt=salt)
    date = utc_now()
    stem = Path(args.output_dir) / (args.name or f"agentic_{dt.datetime.now(dt.timezone.utc):%Y%m%d-%H%M%S}")

    async def sweep() -> list[dict[str, Any]]:
        limits = httpx.Limits(max_connections=max(cfg.concurrencies) + 4)
        timeout = httpx.Timeout(cfg.request_timeout_s, connect=30.0)
        async with httpx.AsyncClient(base_url=args.base_url, headers=headers, timeout=timeout,
                                     limits=limits) as client:
            return await run_sweep(client, options, factory, cfg, Progress(args.progress))

    levels = asyncio.run(sweep())
    run = {
        "tool": f"lightspeed-bench {__version__}", "label": args.label or f"{model} @ {args.base_url}",
        "date": date, "git_commit": git_commit(), "server": server, "model": model,
        "device": server_device(server),
        "flags": {k: v for k, v in vars(args).items() if k not in ("api_key", "func")},
        "workload": workload, "salt": salt,
        "request_fields": {"endpoint": options.endpoint, "ignore_eos": options.ignore_eos,
                           "min_tokens": options.min_tokens, "temperature": options.temperature},
        "levels": [lvl["summary"] for lvl in levels],
        "best_at_floor": None if args.floor is None else best_at_floor([lvl["summary"] for lvl in levels],
                                                                        args.floor),
        "requests": [rec.to_json() for lvl in levels for rec in lvl["records"]],
    }
    json_path, csv_path = write_run(run, stem)
    written = [json_path, csv_path]
    if args.plot:
        written.append(plot_runs([run], stem.with_suffix(".png"), floor=args.floor))
    if not args.quiet:
        print(format_table(run["levels"], per_gpu=run_on_gpu(run)))
        for line in format_errors(run["levels"]):
            print(line)
        if run["best_at_floor"]:
            b = run["best_at_floor"]
            per = "/GPU" if run_on_gpu(run) else ""
            print(f"best above {b['floor_tokens_per_s_per_user']:g} tok/s/user (p10): c={b['concurrency']}, "
                  f"{b['output_tokens_per_min_per_gpu']:.0f} output tok/min{per}")
        print("wrote " + ", ".join(str(p) for p in written))
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    runs = [load_run(path) for path in args.runs]
    out = plot_runs(runs, args.output, y=args.y, floor=args.floor, title=args.title)
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `lightspeed-bench` and of `lightspeed bench` (argv without the program name)."""
    args = build_parser().parse_args(argv)
    if args.command == "agentic":
        return cmd_agentic(args)
    return cmd_plot(args)


if __name__ == "__main__":
    sys.exit(main())
