"""The ranks of a multi-node engine on a node other than 0 (`lightspeed serve ... --node-rank n`).

Node 0 runs the server and the engine core(s); every other node starts its own ranks here and
waits for them. They stop when node 0's engine stops them (or dies: its rendezvous and control
connections close, and every rank fails loudly). One that fails takes the others of its node down
with it, and this process exits non-zero.
"""

from __future__ import annotations

import logging
import signal
import time

from ..config import EngineConfig
from .launch import RankProcesses, describe_exit
from .topology import Topology

log = logging.getLogger("lightspeed.distributed")


def node_ranks(config: EngineConfig) -> tuple[Topology, list[int]]:
    """This node's topology and the global ranks it runs; ValueError on node 0."""
    from ..loader import read_model_config
    from ..runner.factory import load_format_of

    topology = Topology.of(config, read_model_config(config.model, load_format_of(config)).is_moe)
    if topology.node_rank == 0:
        raise ValueError("node 0 runs the engine core and the server: start it without --node-rank")
    return topology, topology.ranks_on_node(topology.node_rank)


def run_node(config: EngineConfig) -> int | None:
    """On a node other than 0: start its ranks and wait for them, returning 0 when they all stopped
    cleanly (1 otherwise). On node 0 (the default): None at once; the caller runs the engine."""
    from ..envs import ENVS

    node = config.node_rank if config.node_rank is not None else ENVS.node_rank
    if not node:
        return None
    topology, ranks = node_ranks(config)
    processes = RankProcesses(on_failure=None, exit_on_failure=False)
    stopping = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    for rank in ranks:
        processes.start(config, rank, topology.master_addr, topology.master_port)
    log.info("node %d of %d runs ranks %s (rendezvous %s:%d)", topology.node_rank, topology.nnodes, ranks,
             topology.master_addr, topology.master_port)
    try:
        while not stopping:
            done = {rank: proc.returncode for rank, proc in processes.procs.items() if proc.poll() is not None}
            failed = {rank: code for rank, code in done.items() if code != 0}
            if failed:
                for rank, code in failed.items():
                    log.error("rank %d %s", rank, describe_exit(code))
                return 1
            if len(done) == len(ranks):
                return 0
            time.sleep(0.2)
        return 0
    finally:
        processes.stop(graceful=not stopping, timeout_s=5.0)
