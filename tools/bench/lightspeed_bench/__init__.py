"""lightspeed-bench: an agentic multi-turn shared-prefix load generator for OpenAI-compatible servers."""

__version__ = "0.1.0"

from .client import RequestOptions, RequestRecord, stream_request  # noqa: E402
from .metrics import summarize_level  # noqa: E402
from .runner import SweepConfig, run_sweep  # noqa: E402
from .workload import AgenticSpec, Conversation, Turn, load_trace  # noqa: E402

__all__ = [
    "AgenticSpec", "Conversation", "RequestOptions", "RequestRecord", "SweepConfig", "Turn",
    "__version__", "load_trace", "run_sweep", "stream_request", "summarize_level",
]
