"""EngineSupervisor: watches the engine core and restarts it when it dies.

Design note. The engine core fails fast and alone: when it dies (device lost, killed, a bug), the
gateway learns it within a health-check interval, in-flight requests end with an error (streams
get an error event), and new ones get 503 + Retry-After while /health says "restarting". The
supervisor then starts a fresh core through `AsyncLLM.restart()` (same config and tokenizer; the
model loads again). Restarts in a row are bounded (`max_engine_restarts`) and spaced by an
exponential back-off after the first, so a core that dies at start-up, or right after each start,
is not restarted forever: then /health says "dead" and stays so. An engine that has stayed up for
STABLE_S counts as healthy again, so isolated deaths days apart never add up to a give-up.
"""

from __future__ import annotations

import asyncio
import logging
import time

from lightspeed_gateway.server.engine import EngineClient

log = logging.getLogger("lightspeed.gateway")

STABLE_S = 60.0  # up this long after a restart: the count of restarts in a row starts again


class EngineSupervisor:
    def __init__(self, engine: EngineClient, interval_s: float, max_restarts: int, backoff_s: float):
        self.engine, self.interval_s = engine, interval_s
        self.max_restarts, self.backoff_s = max_restarts, backoff_s
        self.restarts_in_a_row = 0
        self.num_restarts = 0
        self._up_since = time.monotonic()

    async def run(self) -> None:
        """Until cancelled, or until the engine is dead for good."""
        while True:
            if self.engine.check_alive():
                if self.restarts_in_a_row and time.monotonic() - self._up_since > STABLE_S:
                    self.restarts_in_a_row = 0
                await asyncio.sleep(self.interval_s)
                continue
            if not await self._bring_back():
                return

    async def _bring_back(self) -> bool:
        engine = self.engine
        if not engine.can_restart:
            log.error("the engine core cannot be restarted by this engine client; the server stays down")
            engine.given_up = True
            return False
        while self.restarts_in_a_row < self.max_restarts:
            delay = self.backoff_s * 2 ** (self.restarts_in_a_row - 1) if self.restarts_in_a_row else 0.0
            self.restarts_in_a_row += 1
            log.warning("restarting the engine core (attempt %d of %d%s)", self.restarts_in_a_row,
                        self.max_restarts, f", after {delay:g} s" if delay else "")
            await asyncio.sleep(delay)
            try:
                await engine.restart()
            except Exception as e:
                log.error("the engine core did not start: %s", e)
                continue
            self.num_restarts += 1
            self._up_since = time.monotonic()
            return True
        log.error("the engine core died %d times in a row; giving up (/health says dead)", self.max_restarts)
        engine.given_up = True
        return False
