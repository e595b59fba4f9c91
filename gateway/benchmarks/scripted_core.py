"""A scripted engine core for gateway benchmarks: the real ZMQ protocol, no model.

Started in place of `python -m lightspeed.core.engine_core` by `scripted_server.py`, so the real
`AsyncLLM` client (ZMQ, incremental detokenisation, stop strings) runs in the gateway process.
Every step (SCRIPTED_CORE_STEP_S, default 10 ms: a GPU decode step) each running request gets one
token; the tokens cycle through the ids in SCRIPTED_CORE_TOKENS (a JSON file: real text, so
detokenisation does real work); a request finishes with "length" at its max_tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import zmq
from lightspeed.core import messages as m


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--parent-pid", type=int, default=None)
    args = parser.parse_args()
    config = json.loads(args.config)
    tokens = json.loads(open(os.environ["SCRIPTED_CORE_TOKENS"]).read())
    step_s = float(os.environ.get("SCRIPTED_CORE_STEP_S", "0.01"))
    ctx = zmq.Context()
    inbox, outbox = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    inbox.connect(args.input)
    outbox.connect(args.output)
    max_model_len = config.get("max_model_len") or 8192
    outbox.send(m.encoder.encode(m.Ready(os.getpid(), 49152, max_model_len, 65536, 0, 16, "cpu", "float32", "auto",
                                         [2])))
    running: dict[str, list[int]] = {}  # request id -> [tokens left, next token index, first output sent]
    steps = generated = 0
    next_step = last_stats = time.monotonic()
    while True:
        while inbox.poll(0 if running else 1000):
            msg = m.core_decoder.decode(inbox.recv())
            if isinstance(msg, m.AddRequest):
                running[msg.request_id] = [msg.sampling.max_tokens, hash(msg.request_id) % len(tokens), 0]
            elif isinstance(msg, m.AbortRequests):
                for rid in msg.request_ids:
                    running.pop(rid, None)
            elif isinstance(msg, m.Shutdown):
                return 0
        if args.parent_pid is not None and os.getppid() != args.parent_pid:
            return 0
        if not running:
            next_step = time.monotonic()
            continue
        time.sleep(max(0.0, next_step - time.monotonic()))
        next_step += step_s
        ids, toks, cached, finished = [], [], {}, {}
        for rid, state in list(running.items()):
            ids.append(rid)
            toks.append(tokens[state[1] % len(tokens)])
            state[0] -= 1
            state[1] += 1
            if not state[2]:
                cached[rid], state[2] = 0, 1
            if state[0] <= 0:
                finished[rid] = "length"
                del running[rid]
        steps += 1
        generated += len(ids)
        stats = None
        if time.monotonic() - last_stats >= 0.05:  # as often as the real core reports
            last_stats = time.monotonic()
            stats = m.EngineStats(len(running), 0, 0, 0.0, 65536, 65536, 0, 0, 0, steps, generated, time.time())
        outbox.send(m.encoder.encode(m.StepOutputs(ids, toks, None, cached or None, finished or None, stats)))


if __name__ == "__main__":
    sys.exit(main())
