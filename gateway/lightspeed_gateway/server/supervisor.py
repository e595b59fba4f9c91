"""EngineSupervisor: watches the engine core and restarts it when it dies.

Design note. The engine core fails fast and alone: when it dies (device lost, killed, a bug), the
gateway learns it within a health-check interval, in-flight requests end with an error (streams
get an error event), and new ones get 503 + Retry-After while /health says "restarting". The
supervisor then starts a fresh core through `AsyncLLM.restart()` (same config and tokenizer; the
model loads again). Restarts in a row are bounded (`max_engine_restarts`) and spaced by an
exponential back-off after the first, so a core that dies at start-up, or right after each start,
is not restarted forever: then /health says "dead" and stays so. An engine that has stayed up for
STABLE_S counts as healthy again, so isolated deaths days apart never add up to a give-up.

Data-parallel cores in separate worlds (`EngineClient.num_cores` > 0) are watched one by one, each
with its own count and back-off: one core's death fails only its requests and restarts only it,
while the others serve (the engine is down, 503, only while every core is). Cores that step
together are one engine here: they die and restart together.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from lightspeed_gateway.server.engine import EngineClient

log = logging.getLogger("lightspeed.gateway")

STABLE_S = 60.0  # up this long after a restart: the count of restarts in a row starts again


class EngineSupervisor:
    def __init__(self, engine: EngineClient, interval_s: float, max_restarts: int, backoff_s: float):
        self.engine, self.interval_s = engine, interval_s
        self.max_restarts, self.backoff_s = max_restarts, backoff_s
        self.num_restarts = 0

    async def run(self) -> None:
        """Until cancelled, or until the engine (every core of it) is dead for good."""
        engine = self.engine
        if not engine.can_restart:
            while engine.check_alive():
                await asyncio.sleep(self.interval_s)
            log.error("the engine core cannot be restarted by this engine client; the server stays down")
            engine.given_up = True
            return
        if not engine.num_cores:
            await _Watch(self, "the engine core", engine.check_alive, engine.restart).run()
            engine.given_up = True
            return
        watches = [_Watch(self, f"data-parallel engine core {d}", lambda d=d: engine.check_core(d),
                          lambda d=d: engine.restart_core(d)) for d in range(engine.num_cores)]
        await asyncio.gather(*(self._watch_core(watch, d) for d, watch in enumerate(watches)))

    async def _watch_core(self, watch: _Watch, core: int) -> None:
        await watch.run()
        self.engine.give_up_core(core)


class _Watch:
    """One engine (or one independent core): restarts in a row bounded, spaced by back-off."""

    def __init__(self, supervisor: EngineSupervisor, what: str, check_alive: Callable[[], bool],
                 restart: Callable[[], Awaitable[None]]):
        self.supervisor, self.what = supervisor, what
        self.check_alive, self.restart = check_alive, restart
        self.restarts_in_a_row = 0
        self._up_since = time.monotonic()

    async def run(self) -> None:
        """Returns when it gave up (died max_restarts times in a row)."""
        while True:
            if self.check_alive():
                if self.restarts_in_a_row and time.monotonic() - self._up_since > STABLE_S:
                    self.restarts_in_a_row = 0
                await asyncio.sleep(self.supervisor.interval_s)
                continue
            if not await self._bring_back():
                return

    async def _bring_back(self) -> bool:
        sup = self.supervisor
        while self.restarts_in_a_row < sup.max_restarts:
            delay = sup.backoff_s * 2 ** (self.restarts_in_a_row - 1) if self.restarts_in_a_row else 0.0
            self.restarts_in_a_row += 1
            log.warning("restarting %s (attempt %d of %d%s)", self.what, self.restarts_in_a_row,
                        sup.max_restarts, f", after {delay:g} s" if delay else "")
            await asyncio.sleep(delay)
            try:
                await self.restart()
            except Exception as e:
                log.error("%s did not start: %s", self.what, e)
                continue
            sup.num_restarts += 1
            self._up_since = time.monotonic()
            return True
        log.error("%s died %d times in a row; giving up (/health says dead)", self.what, sup.max_restarts)
        return False
