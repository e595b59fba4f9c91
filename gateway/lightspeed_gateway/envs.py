"""Environment variables of the gateway, read once, in one typed place."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class GatewayEnvs:
    api_key: str | None
    """LIGHTSPEED_API_KEY: the API key clients must send (the --api-key flag overrides it)."""


def load_envs() -> GatewayEnvs:
    return GatewayEnvs(api_key=os.environ.get("LIGHTSPEED_API_KEY") or None)
