"""Anthropic Messages API: POST /v1/messages (+ /count_tokens), mounted as `router`.

Requests are converted (and normalised: billing header, cache_control, reminders) into the
renderer's messages, so turn k+1's prompt tokens extend turn k's; errors come out in Anthropic's
shape (`errors.py`).
"""

from lightspeed_gateway.anthropic.errors import error_response
from lightspeed_gateway.anthropic.messages import router

__all__ = ["router", "error_response"]
