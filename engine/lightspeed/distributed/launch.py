"""Starting the ranks of an engine core, and watching them.

The engine core (its attention group's rank 0) opens the rendezvous, starts one plain subprocess
per other rank of its group on this node (`python -m lightspeed.distributed.worker`; ranks on other
nodes are started there by `lightspeed serve ... --node-rank n`) and joins the world. A watchdog
thread polls the processes it started: when one exits, it reports which rank died and how (the
engine core sends that as its failure message), stops the others and ends the engine core, so a
killed rank never leaves the engine hanging in a collective or orphans behind. Every rank it
starts also dies with it (Linux parent-death signal).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from ..config import EngineConfig
from ..envs import ENVS
from .ranks import Ranks
from .topology import Topology

log = logging.getLogger("lightspeed.distributed")

WATCH_INTERVAL_S = 0.2
EXIT_RANK_DIED = 3


def die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when its parent dies, so no rank outlives its engine."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def rank_device(config: EngineConfig, topology: Topology, rank: int) -> torch.device:
    from ..runner.factory import resolve_device

    device = resolve_device(config.device)
    if device.type != "cuda":
        return device
    index = topology.local_index(rank)
    if index >= torch.cuda.device_count():
        raise ValueError(f"rank {rank} needs GPU {index} on its node, which has {torch.cuda.device_count()}")
    return torch.device("cuda", index)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class RankProcesses:
    """The rank processes this process started, and the watchdog over them."""

    def __init__(self, on_failure: Callable[[str], None] | None, exit_on_failure: bool):
        self.procs: dict[int, subprocess.Popen] = {}
        self.on_failure, self.exit_on_failure = on_failure, exit_on_failure
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, config: EngineConfig, rank: int, addr: str, port: int) -> None:
        cmd = [sys.executable, "-m", "lightspeed.distributed.worker", "--config",
               json.dumps(dataclasses.asdict(config)), "--rank", str(rank), "--master-addr", addr,
               "--master-port", str(port), "--parent-pid", str(os.getpid())]
        self.procs[rank] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values()]

    def watch(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="rank-watchdog", daemon=True)
        self._thread.start()

    def dead(self) -> tuple[int, subprocess.Popen] | None:
        for rank, proc in self.procs.items():
            if proc.poll() is not None:
                return rank, proc
        return None

    def diagnose(self, wait_s: float = 2.0) -> str | None:
        """Which started rank died and how, waiting up to `wait_s` for its exit to show (a collective
        usually fails a moment before the peer's exit status is visible)."""
        deadline = time.monotonic() + wait_s
        while True:
            dead = self.dead()
            if dead is not None:
                rank, proc = dead
                return f"rank {rank} (pid {proc.pid}) {describe_exit(proc.returncode)}"
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def _watch(self) -> None:
        while not self._stopping.wait(WATCH_INTERVAL_S):
            dead = self.dead()
            if dead is None:
                continue
            rank, proc = dead
            message = (f"tensor/expert-parallel rank {rank} (pid {proc.pid}) {describe_exit(proc.returncode)}; "
                       f"the engine stopped")
            log.error("%s", message)
            if self.on_failure is not None:
                try:
                    self.on_failure(message)
                except Exception:  # reporting is best effort: the exit below is what matters
                    log.exception("could not report the rank failure")
            self.stop(graceful=False)
            if self.exit_on_failure:
                os._exit(EXIT_RANK_DIED)  # the main thread may be blocked in a collective forever
            return

    def expect_exit(self) -> None:
        """The ranks are about to be told to stop: from now on their exits are no failure."""
        self._stopping.set()

    def stop(self, graceful: bool = True, timeout_s: float = 10.0) -> None:
        """Wait for the ranks (graceful: they were told to stop), then terminate what is left."""
        self._stopping.set()
        deadline = time.monotonic() + (timeout_s if graceful else 0.0)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class EngineRanks(Ranks):
    """`Ranks` of an engine core: also the rank processes it started."""

    processes: RankProcesses

    def close(self, graceful: bool = True) -> None:
        self.processes.stop(graceful=graceful)
        super().close()


def start_ranks(config: EngineConfig, topology: Topology,
                on_failure: Callable[[str], None] | None = None) -> EngineRanks:
    """The engine core's side: rendezvous, start this node's other ranks of its attention group,
    join the world. `on_failure(message)` runs (on the watchdog thread) when a started rank dies,
    before this process exits."""
    rank = topology.leader
    device = rank_device(config, topology, rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before NCCL creates this rank's communicators
    timeout = ENVS.distributed_timeout_s
    from datetime import timedelta

    is_master = rank == 0
    store = dist.TCPStore(topology.master_addr, topology.master_port or 0, topology.world_size,
                          is_master=is_master, timeout=timedelta(seconds=timeout), wait_for_workers=False)
    port = store.port
    processes = RankProcesses(on_failure, exit_on_failure=True)
    here = topology.node_of(rank)
    for peer in topology.attention_ranks(topology.dp_rank):
        if peer != rank and topology.node_of(peer) == here:
            processes.start(config, peer, topology.master_addr, port)
    processes.watch()
    try:
        ranks = EngineRanks(topology, rank, device, store, timeout)
    except BaseException:
        processes.stop(graceful=False)
        raise
    ranks.processes = processes
    log.info("rank %d of %d (attention group %d of %d, experts over %d) on %s; rendezvous %s:%d", rank,
             topology.world_size, topology.dp_rank, topology.dp, max(topology.ep, 1), device,
             topology.master_addr, port)
    return ranks


def join_ranks(config: EngineConfig, topology: Topology, rank: int, addr: str, port: int) -> Ranks:
    """A worker's side: connect to the rendezvous and join the world as `rank`."""
    from datetime import timedelta

    device = rank_device(config, topology, rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = ENVS.distributed_timeout_s
    store = dist.TCPStore(addr, port, topology.world_size, is_master=False, timeout=timedelta(seconds=timeout))
    return Ranks(topology, rank, device, store, timeout)
