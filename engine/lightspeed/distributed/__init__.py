"""Tensor, expert and data parallelism over torch.distributed: topology, rank processes, the step
packet broadcast, rank 0's `DriverRunner` and the other ranks' worker loop (see engine/README.md)."""

from .driver import DriverRunner
from .launch import EngineRanks, start_ranks
from .ranks import Ranks
from .topology import Topology, data_parallel_configs

__all__ = ["DriverRunner", "EngineRanks", "Ranks", "Topology", "data_parallel_configs", "start_ranks"]
