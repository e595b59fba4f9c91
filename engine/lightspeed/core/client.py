"""EngineCoreClient: starts the engine core process and talks to it over ZMQ (ipc:// in a temp dir).

The client binds a PUSH socket (requests) and a PULL socket (outputs); the core connects to both.
The core is a plain subprocess (`python -m lightspeed.core.engine_core`), so user scripts need no
`if __name__ == "__main__"` guard. Death detection: `poll_output` returns None on timeout and the
caller checks `is_alive()`; the core itself exits when its parent dies (prctl PDEATHSIG). A
`weakref.finalize` (which also runs at interpreter exit) terminates the process and removes the
socket folder, so no orphan survives a forgotten `shutdown()`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import weakref

import zmq
import zmq.asyncio

from ..config import EngineConfig
from ..envs import ENVS
from . import messages as m
from .errors import EngineDeadError

# Client messages queued towards the core before senders wait: the core takes up to a few hundred
# per loop iteration, so this only binds when the core cannot keep up.
INPUT_HIGH_WATER_MARK = 4096


def _terminate(proc: subprocess.Popen, ctx: zmq.Context, sockets: list, folder: str, input_sock) -> None:
    _stop(proc, input_sock)
    for sock in sockets:
        sock.close(linger=0)
    ctx.term()
    shutil.rmtree(folder, ignore_errors=True)


def _stop(proc: subprocess.Popen, input_sock) -> None:
    if proc.poll() is None:
        try:
            input_sock.send(m.encoder.encode(m.Shutdown()), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class EngineCoreClient:
    def __init__(self, config: EngineConfig):
        self.config = config
        self._folder = tempfile.mkdtemp(prefix="lightspeed-", dir=ENVS.rpc_base_dir)
        input_addr, output_addr = f"ipc://{self._folder}/input", f"ipc://{self._folder}/output"
        self._ctx = zmq.Context()
        self._input = self._ctx.socket(zmq.PUSH)
        self._input.setsockopt(zmq.LINGER, 1000)
        self._input.setsockopt(zmq.SNDHWM, INPUT_HIGH_WATER_MARK)
        self._input.bind(input_addr)
        self._output = self._ctx.socket(zmq.PULL)
        self._output.bind(output_addr)
        cmd = [sys.executable, "-m", "lightspeed.core.engine_core", "--input", input_addr, "--output", output_addr,
               "--config", json.dumps(dataclasses.asdict(config)), "--parent-pid", str(os.getpid())]
        # Its own session: a Ctrl-C in the terminal reaches only us, and we stop the core in order
        # (it still dies with us: PDEATHSIG).
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True)
        self._async_output: zmq.asyncio.Socket | None = None
        self._finalizer = weakref.finalize(self, _terminate, self.proc, self._ctx, [self._input, self._output],
                                           self._folder, self._input)
        self.ready: m.Ready | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def is_alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self) -> m.Ready:
        """Block until the core reports Ready (model loaded); ValueError for a bad configuration or model,
        EngineDeadError if the core dies first."""
        deadline = time.monotonic() + ENVS.engine_ready_timeout_s
        poll_ms = int(ENVS.engine_poll_interval_s * 1000)
        while time.monotonic() < deadline:
            if self._output.poll(poll_ms):
                msg = m.client_decoder.decode(self._output.recv())
                if isinstance(msg, m.Ready):
                    self.ready = msg
                    return msg
                if isinstance(msg, m.EngineFailure):
                    self.close()
                    if msg.user_error:
                        raise ValueError(msg.message)
                    raise EngineDeadError(f"engine core failed to start:\n{msg.message}")
            elif not self.is_alive():
                code = self.proc.returncode
                self.close()
                raise EngineDeadError(f"engine core exited with code {code} before it was ready")
        self.close()
        raise EngineDeadError(f"engine core not ready after {ENVS.engine_ready_timeout_s:.0f} s")

    def send(self, msg: m.AddRequest | m.AbortRequests | m.Shutdown) -> None:
        """Send without ever blocking: zmq.Again when the core's input queue is full (the caller waits
        and retries: back-pressure), EngineDeadError when the core is gone."""
        self._check_alive()
        self._input.send(m.encoder.encode(msg), zmq.NOBLOCK, copy=False)

    def _check_alive(self) -> None:
        if not self.is_alive():
            raise EngineDeadError(f"engine core (pid {self.proc.pid}) is dead (exit code {self.proc.returncode})")

    async def poll_output(self, timeout_s: float):
        """The next core message, or None after `timeout_s` without one (check is_alive() then)."""
        if self._async_output is None:
            self._async_output = zmq.asyncio.Socket.from_socket(self._output)
        if not await self._async_output.poll(int(timeout_s * 1000)):
            return None
        return m.client_decoder.decode(await self._async_output.recv(copy=False))

    async def aclose(self) -> None:
        """`close()` for the event loop: the wait for the core to stop (seconds, when it is draining
        or its ranks are going down) runs in a worker thread, so the loop keeps serving meanwhile."""
        if self.ready is None and self.is_alive():
            self.proc.terminate()
        if self._finalizer.alive:
            await asyncio.get_running_loop().run_in_executor(None, _stop, self.proc, self._input)
        self.close()  # the core has stopped: what is left is quick

    def close(self) -> None:
        """Stop the core (Shutdown, then SIGTERM/SIGKILL if it lingers) and free sockets and files.
        Call it on the event loop thread that polls outputs (if any), so the loop lets go of the socket
        first: closing a socket the loop still watches makes the loop raise ENOTSOCK later."""
        if self.ready is None and self.is_alive():
            self.proc.terminate()  # still loading: it reads no Shutdown until the model is in, so stop it now
        if self._async_output is not None and self._finalizer.alive:
            _stop(self.proc, self._input)       # the core's last messages still reach an open socket
            self._async_output.close(linger=0)  # cancels a pending poll and unregisters its file descriptor
            self._async_output = None
        self._finalizer()
