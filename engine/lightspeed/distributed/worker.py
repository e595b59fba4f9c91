"""A rank other than an engine core's rank 0: it runs what the step packets say, nothing else.

    python -m lightspeed.distributed.worker --config '{json}' --rank R --master-addr A --master-port P

It builds the same model runner as rank 0 (its shard of the weights and of the KV pool, the same
CUDA graphs), then loops: receive a packet -> order work after the copies rank 0 acknowledged ->
start this step's page copies -> upload the packet and run the forward -> receive the sampled
tokens (the next step's deferred inputs). No scheduler, no sampler, no sockets. It stops on the
stop packet, exits when its parent dies, and fails loudly (non-zero exit: the engine core's
watchdog reports it) on any error.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import torch

from ..config import EngineConfig
from ..runner.inputs import KIND_STOP
from ..runner.model_runner import ModelRunner
from .launch import die_with_parent, join_ranks
from .ranks import Ranks
from .topology import Topology

log = logging.getLogger("lightspeed.distributed")


class WorkerLoop:
    def __init__(self, runner: ModelRunner, ranks: Ranks):
        self.runner, self.ranks = runner, ranks

    @torch.inference_mode()
    def run(self) -> None:
        runner, ranks = self.runner, self.ranks
        copier, tokens = runner.kv_cache.copier, runner.model.model.tokens
        prev_sampled: torch.Tensor | None = None
        while True:
            packet = ranks.receive_packet()
            if packet.kind == KIND_STOP:
                break
            copier.retire(packet.acks)
            if packet.has_copies:
                copier.submit(packet.step_id, packet.write_back, packet.load_back, packet.forward_waits_for_copies)
            if packet.num_tokens == 0:
                continue
            tokens.pad_to = packet.pad_to or None
            runner.forward_unsampled(packet.view(), runner.inputs.unpack(packet, prev_sampled))
            if packet.num_sampled:
                prev_sampled = ranks.receive_tokens(packet.num_sampled)
            if packet.report_load:
                ranks.reduce_to_leader(runner.expert_load.local_total())
        copier.wait_all()


def run_worker(config: EngineConfig, rank: int, master_addr: str, master_port: int) -> None:
    from ..envs import ENVS
    from ..loader import read_model_config
    from ..runner.factory import build_model_runner, load_format_of

    threads = config.num_threads or ENVS.num_threads
    if threads:
        torch.set_num_threads(threads)
    is_moe = read_model_config(config.model, load_format_of(config)).is_moe
    topology = Topology.of(config, is_moe)
    ranks = join_ranks(config, topology, rank, master_addr, master_port)
    try:
        built = build_model_runner(config, ranks=ranks)
        WorkerLoop(built.runner, ranks).run()
    finally:
        ranks.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Lightspeed tensor/expert-parallel rank")
    parser.add_argument("--config", required=True, help="EngineConfig as JSON")
    parser.add_argument("--rank", type=int, required=True, help="global rank in the world")
    parser.add_argument("--master-addr", required=True)
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, default=None)
    args = parser.parse_args(argv)
    die_with_parent()
    if args.parent_pid is not None and os.getppid() != args.parent_pid:
        return 1  # the parent died before prctl took effect
    from ..envs import ENVS

    logging.basicConfig(level=ENVS.log_level, format=f"%(asctime)s %(levelname)s rank-{args.rank}: %(message)s")
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the server, which stops the engine
    try:
        run_worker(EngineConfig(**json.loads(args.config)), args.rank, args.master_addr, args.master_port)
    except Exception:
        log.exception("rank %d failed", args.rank)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
