"""Where the ranks of an engine core are: the torch.distributed world it belongs to and its groups.

Design note. One engine core drives the `tensor_parallel_size` ranks of its attention group; it
is rank 0 of that group (the scheduler and the sampler live there). Data-parallel cores are
separate engine cores (the gateway routes between them). They form separate worlds, each with its
own rendezvous, unless their MoE layers share one expert-parallel group (`--enable-expert-parallel`
with EP = TP x DP): then all cores and their ranks are one world of TP x DP ranks, the cores step
together, and rank `d * TP` leads data-parallel group d. Ranks are numbered node-major: node n holds
ranks `[n * per_node, (n + 1) * per_node)`, and every engine core must lead on node 0 (nodes > 0 run
ranks only: `lightspeed serve ... --node-rank n`).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from ..config import EngineConfig
from ..envs import ENVS
from ..kv.disk import default_disk_size


@dataclass(frozen=True)
class Topology:
    """The world of one engine core (or of the data-parallel cores that step together)."""

    tp: int                    # ranks of an attention group (tensor parallel)
    dp: int                    # attention groups in this world: > 1 only when data-parallel cores step together
    dp_rank: int               # the attention group this engine core leads (within this world)
    ep: int                    # ranks the experts are split over (1: experts sliced by the MoE's TP group)
    sequence_parallel: bool
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int | None    # None: rank 0 picks a free port (one node, one world per core)
    gpu_offset: int            # first local GPU of this world (data-parallel cores in separate worlds)

    @property
    def world_size(self) -> int:
        return self.tp * self.dp

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.nnodes

    @property
    def leader(self) -> int:
        """Global rank of this engine core."""
        return self.dp_rank * self.tp

    @property
    def lockstep(self) -> bool:
        """Data-parallel cores share the world: every core runs every step (an idle one a dummy)."""
        return self.dp > 1

    def attention_ranks(self, group: int) -> list[int]:
        return list(range(group * self.tp, (group + 1) * self.tp))

    def group_of(self, rank: int) -> int:
        return rank // self.tp

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def local_index(self, rank: int) -> int:
        """The GPU index of `rank` on its node."""
        return self.gpu_offset + rank % self.ranks_per_node

    def ranks_on_node(self, node: int) -> list[int]:
        return list(range(node * self.ranks_per_node, (node + 1) * self.ranks_per_node))

    @classmethod
    def of(cls, config: EngineConfig, is_moe: bool) -> Topology:
        """The topology `config` asks for; ValueError for layouts the engine cannot run."""
        tp, dp = config.tensor_parallel_size, config.data_parallel_size
        dp_rank = config.data_parallel_rank or 0
        ep = config.expert_parallel_ranks if is_moe else 1
        lockstep = ep == tp * dp and dp > 1  # as in data_parallel_configs
        nnodes = nodes_of(config)
        node_rank = config.node_rank if config.node_rank is not None else ENVS.node_rank or 0
        port = config.master_port if config.master_port is not None else ENVS.master_port
        world_dp = dp if lockstep else 1
        top = cls(tp=tp, dp=world_dp, dp_rank=dp_rank if lockstep else 0, ep=ep,
                  sequence_parallel=config.enable_sequence_parallel, nnodes=nnodes, node_rank=node_rank,
                  master_addr=config.master_addr or ENVS.master_addr or "127.0.0.1",
                  master_port=port if lockstep or port is None else port + dp_rank,
                  gpu_offset=0 if lockstep or nnodes > 1 else dp_rank * tp)
        top._check(dp)
        return top

    def _check(self, data_parallel_size: int) -> None:
        world, nnodes = self.world_size, self.nnodes
        if world % nnodes:
            raise ValueError(f"{world} ranks (tensor x stepping-together data parallel size) do not split over "
                             f"{nnodes} nodes")
        if nnodes > 1:
            if self.master_port is None:
                raise ValueError("--nnodes > 1 needs --master-port (or MASTER_PORT) for the rendezvous on node 0")
            if data_parallel_size > 1 and self.dp == 1:
                raise ValueError("data-parallel cores in separate worlds run on one node; across nodes, use one "
                                 "world (--enable-expert-parallel on a MoE model) or one core (-dp 1)")
            leaders = [g * self.tp for g in range(self.dp)]
            if any(self.node_of(r) != 0 for r in leaders):
                raise ValueError(f"every engine core must lead on node 0, but ranks {leaders} of {world} over "
                                 f"{nnodes} nodes put one on another node: use fewer data-parallel cores per node")
        if self.lockstep and self.master_port is None:
            raise ValueError("data-parallel cores that step together need one --master-port (the server sets it)")


def data_parallel_configs(config: EngineConfig) -> list[EngineConfig]:
    """One `EngineConfig` per data-parallel engine core of `config` (its `data_parallel_rank` set):
    what a front end starts, one `AsyncLLM` each. Cores that step together (a MoE model with
    expert parallelism across them) share one rendezvous port, picked here when none is given."""
    dp = config.data_parallel_size
    if dp == 1:
        return [config.replace(data_parallel_rank=0)]
    from ..loader import read_model_config
    from ..runner.factory import load_format_of

    is_moe = read_model_config(config.model, load_format_of(config)).is_moe
    port = config.master_port if config.master_port is not None else ENVS.master_port
    steps_together = is_moe and config.expert_parallel_ranks == config.tensor_parallel_size * dp
    if steps_together and port is None:
        port = free_port()
    if config.disk_cache_dir is None:
        return [config.replace(data_parallel_rank=d, master_port=port) for d in range(dp)]
    if steps_together:  # a core flushing its disk writes at shutdown steps alone: the others have stopped
        raise ValueError("disk_cache_dir with data-parallel cores that step together (expert parallelism "
                         "across them) is not supported in this version")
    # One engine per directory (the tier locks its files): each core gets its own, and a share of the size.
    size = config.disk_cache_size if config.disk_cache_size is not None else default_disk_size(config.disk_cache_dir)
    return [config.replace(data_parallel_rank=d, master_port=port, disk_cache_size=size // dp,
                           disk_cache_dir=os.path.join(config.disk_cache_dir, f"dp{d}")) for d in range(dp)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nodes_of(config: EngineConfig) -> int:
    """Machines the ranks span: --nnodes, else torchrun's environment, else 1."""
    return config.nnodes or ENVS.nnodes or 1


def engine_ranks_per_node(config: EngineConfig) -> int:
    """GPUs one node serves with: every data-parallel core's tensor-parallel ranks, over the nodes. What the
    ranks of a node share (the RAM their host KV tiers pin) is split this many ways."""
    return max(1, config.tensor_parallel_size * config.data_parallel_size // nodes_of(config))
