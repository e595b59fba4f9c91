"""Multi-node through the same code, simulated on one machine: "node 0" is the engine core (rank 0),
"node 1" is `run_node` (what `lightspeed serve ... --nnodes 2 --node-rank 1` runs) starting rank 1;
they meet at --master-addr/--master-port and give the one-rank tokens. Node 1 exits cleanly when
the engine stops."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

from conftest_models import hf_reference_model
from engine_driver import make_engine, run_until_idle, submit
from lightspeed.config import EngineConfig
from lightspeed.core.messages import SamplingSpec
from lightspeed.distributed.topology import free_port

SPEC = SamplingSpec(max_tokens=6, temperature=0.0, ignore_eos=True)
PROMPTS = {"a": list(range(3, 40)), "b": [5, 9, 2, 7]}


def _tokens(engine) -> dict[str, list[int]]:
    for name, prompt in PROMPTS.items():
        submit(engine, name, prompt, SPEC)
    return run_until_idle(engine).tokens


def test_two_nodes_give_the_one_rank_tokens(tmp_path):
    hf_reference_model("tiny-qwen3-moe", seed=3).save_pretrained(tmp_path)
    settings = dict(load_format="auto", kv_cache_memory="8MiB", host_cache_memory="1MiB", max_num_seqs=8,
                    max_model_len=256, num_threads=1)
    want = _tokens(make_engine(str(tmp_path), **settings))
    nodes = dict(tensor_parallel_size=2, enable_expert_parallel=True, nnodes=2, master_addr="127.0.0.1",
                 master_port=free_port())
    node1 = EngineConfig(model=str(tmp_path), **settings, **nodes, node_rank=1)
    script = ("import json, sys; from lightspeed import EngineConfig, run_node; "
              "sys.exit(run_node(EngineConfig(**json.loads(sys.argv[1]))))")
    proc = subprocess.Popen([sys.executable, "-c", script, json.dumps(dataclasses.asdict(node1))],
                            env={**os.environ})
    try:
        engine = make_engine(str(tmp_path), **settings, **nodes, node_rank=0)
        assert engine.runner.rank_pids == []  # rank 1 lives on "node 1"
        try:
            assert _tokens(engine) == want
        finally:
            engine.drain_copies()
            engine.shutdown()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
