#!/usr/bin/env python3
"""Write the re-quoting agentic trace for speculative-decoding benchmarks:
`python tools/bench/requote_trace.py OUT.jsonl [--conversations 32 --turns 4 --file-lines 60 --output-tokens 400]`,
then `lightspeed-bench agentic --trace OUT.jsonl ...`."""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lightspeed_bench.requote import write_requote_trace  # noqa: E402

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("out")
    p.add_argument("--conversations", type=int, default=32)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--file-lines", type=int, default=60)
    p.add_argument("--output-tokens", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    print(write_requote_trace(a.out, conversations=a.conversations, turns=a.turns, file_lines=a.file_lines,
                              output_tokens=a.output_tokens, seed=a.seed))
