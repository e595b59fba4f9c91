"""The engine core process: one loop, schedule -> execute -> update.

    python -m lightspeed.core.engine_core --input ipc://... --output ipc://... --config '{json}'

It connects a PULL socket (requests from the client) and a PUSH socket (outputs to the client),
loads the model, sends `Ready`, then loops. It exits on `Shutdown`, when its parent dies (Linux
parent-death signal, plus a getppid check while idle), or on an exception, which it reports as
`EngineFailure` first so the client can fail its in-flight requests.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
import traceback

import msgspec
import numpy as np
import zmq

from ..config import EngineConfig
from . import messages as m
from .engine import Engine
from .faults import FatalEngineError

log = logging.getLogger("lightspeed.core")

STATS_INTERVAL_S = 0.05
IDLE_POLL_MS = 1000
COPY_POLL_MS = 1  # idle but KV copies or grammar compilations in flight: look at them this often
LOCKSTEP_POLL_MS = 2  # idle, but data-parallel cores that step together wait on each other this long
MAX_DRAIN = 256   # client messages taken per loop iteration


class EngineCore:
    def __init__(self, engine: Engine, input_sock: zmq.Socket, output_sock: zmq.Socket):
        self.engine, self.input, self.output = engine, input_sock, output_sock
        self.running = True
        self._last_stats = 0.0
        self._last_idle = 0.0  # last idle stats report and parent check
        self._parent = os.getppid()

    def run(self) -> None:
        """The step loop. Each iteration: take new requests/aborts, run one plan, send its outputs."""
        engine = self.engine
        idle_ms = LOCKSTEP_POLL_MS if engine.steps_with_others else IDLE_POLL_MS
        while True:
            copying = engine.has_pending_copies()
            waiting = copying or engine.has_pending_grammars()  # look again soon, without spinning
            wait_ms = 0 if engine.has_work() else COPY_POLL_MS if waiting else idle_ms
            rejected = self._drain_inputs(wait_ms)
            engine.admit_compiled()
            # Data-parallel cores that step together all step when any has work, and stop together.
            step, stop = engine.agree_to_step(engine.has_work() or copying, stopping=not self.running)
            if step:
                outputs = self._with_stats(engine.step())    # launch N+1 -> collect N -> advance N
                if outputs.request_ids or outputs.finished or outputs.stats is not None:
                    self._send(outputs)
            errors = engine.take_errors(rejected)
            if errors is not None:
                self._send(errors)
            if stop:
                break
        engine.drain_copies()

    def _drain_inputs(self, wait_ms: int) -> dict[str, str]:
        """Take what the client sent, at most MAX_DRAIN messages (the rest waits in the socket, whose
        high-water mark then makes the client wait: back-pressure instead of an unbounded queue)."""
        errors: dict[str, str] = {}
        if wait_ms and not self.input.poll(wait_ms):
            if wait_ms >= LOCKSTEP_POLL_MS and time.monotonic() - self._last_idle >= IDLE_POLL_MS / 1000:
                self._last_idle = time.monotonic()
                self._check_parent()
                self._send(m.StepOutputs([], [], stats=self.engine.stats()))
            return errors
        for _ in range(MAX_DRAIN):
            try:
                frame = self.input.recv(zmq.NOBLOCK)
            except zmq.Again:
                return errors
            try:
                msg = m.core_decoder.decode(frame)
            except msgspec.DecodeError as e:  # a malformed message: nobody's request, nothing to fail
                log.error("ignored a malformed client message: %s", e)
                continue
            if isinstance(msg, m.AddRequest):
                error = self.engine.add_request(msg)
                if error is not None:
                    errors[msg.request_id] = error
            elif isinstance(msg, m.AbortRequests):
                self.engine.abort_requests(msg.request_ids)
            elif isinstance(msg, m.Shutdown):
                self.running = False
                return errors
        return errors

    def _with_stats(self, outputs: m.StepOutputs) -> m.StepOutputs:
        now = time.monotonic()
        if now - self._last_stats < STATS_INTERVAL_S:
            return outputs
        self._last_stats = now
        return msgspec.structs.replace(outputs, stats=self.engine.stats())

    def _send(self, msg) -> None:
        self.output.send(m.encoder.encode(msg), copy=False)

    def _check_parent(self) -> None:
        if os.getppid() != self._parent:
            log.warning("parent process exited; engine core shutting down")
            self.running = False


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM us when the parent dies, so a killed client leaves no orphan."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Lightspeed engine core process")
    parser.add_argument("--input", required=True, help="ZMQ address the client sends requests on")
    parser.add_argument("--output", required=True, help="ZMQ address the core sends outputs on")
    parser.add_argument("--config", required=True, help="EngineConfig as JSON")
    parser.add_argument("--parent-pid", type=int, default=None)
    args = parser.parse_args(argv)
    _die_with_parent()
    if args.parent_pid is not None and os.getppid() != args.parent_pid:
        return 1  # the parent died before prctl took effect
    from ..envs import ENVS

    logging.basicConfig(level=ENVS.log_level, format="%(asctime)s %(levelname)s engine-core: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the client, which shuts us down
    ctx = zmq.Context()
    input_sock = ctx.socket(zmq.PULL)
    input_sock.connect(args.input)
    output_sock = ctx.socket(zmq.PUSH)
    output_sock.connect(args.output)
    output_sock.setsockopt(zmq.LINGER, 2000)

    def report_rank_failure(message: str) -> None:
        """On the watchdog's thread, just before the process exits: a context of its own, whose term()
        waits (up to the linger) until the message is out."""
        own = zmq.Context()
        sock = own.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 2000)
        sock.connect(args.output)
        sock.send(m.encoder.encode(m.EngineFailure(message, reason=message)))
        sock.close()
        own.term()

    engine = None
    try:
        try:
            config = EngineConfig(**json.loads(args.config))
            engine = Engine(config, on_rank_failure=report_rank_failure)
        except ValueError as e:  # the user's configuration or model files: the client reports the reason
            log.debug("engine core start-up failed:\n%s", traceback.format_exc())
            output_sock.send(m.encoder.encode(m.EngineFailure(str(e), user_error=True)))
            return 2
        # Not on CPU (tests start an engine each; nothing there JIT-compiles for minutes), nor when
        # data-parallel cores step together (one core's warm-up steps would wait on the others').
        if engine.runner.device.type != "cpu" and not engine.steps_with_others:
            log.info("warm-up request done in %.1f s (kernels compiled before the first request)",
                     engine.warm_up())
        output_sock.send(m.encoder.encode(engine.ready_message()))
        EngineCore(engine, input_sock, output_sock).run()
        engine.shutdown()
    except BaseException as error:
        reason = error.reason if isinstance(error, FatalEngineError) else ""
        output_sock.send(m.encoder.encode(m.EngineFailure(traceback.format_exc(), reason=reason)))
        log.error("engine core failed:\n%s", traceback.format_exc())
        if engine is not None:
            engine.runner.shutdown(graceful=False)  # its ranks may be stuck in a collective: stop them now
        return 1
    finally:
        input_sock.close(linger=0)
        output_sock.close()
        ctx.term()
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
