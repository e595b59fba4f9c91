"""Prometheus metrics, names prefixed `lightspeed:`. One registry per app (tests start several)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                    40.0, 80.0)
_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)


class EngineStatsCollector:
    """Reads the engine's stats snapshot at scrape time: gauges and the engine's own counters."""

    def __init__(self, read_stats: Callable[[], Any], model_name: str) -> None:
        self._read_stats = read_stats
        self._model = model_name

    def collect(self):
        stats = self._read_stats()
        if not stats or "num_running" not in stats:
            return  # no snapshot from the core yet: no number beats a wrong zero
        labels = (["model_name"], [self._model])

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=labels[0])
            family.add_metric(labels[1], float(value))
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=labels[0])
            family.add_metric(labels[1], float(value))
            return family

        get = lambda name: stats.get(name) or 0  # noqa: E731
        yield gauge("lightspeed:num_requests_running", "Requests prefilling or decoding in the engine.",
                    get("num_running"))
        yield gauge("lightspeed:num_requests_waiting", "Requests waiting for the scheduler.", get("num_waiting"))
        yield gauge("lightspeed:num_requests_retracted", "Requests swapped out under memory pressure.",
                    get("num_retracted"))
        yield gauge("lightspeed:kv_cache_usage_perc", "Fraction of device KV-cache pages held by requests (0..1); "
                    "cached prefix pages no request holds are reusable and count as free.", get("kv_usage"))
        yield gauge("lightspeed:kv_cache_free_pages", "Free device KV-cache pages.", get("free_device_pages"))
        yield gauge("lightspeed:kv_cache_cached_pages", "Device KV-cache pages holding prefix-cache entries "
                    "(shared by running requests or kept for reuse).", get("cached_device_pages"))
        yield counter("lightspeed:prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache.",
                      get("prefix_hit_tokens"))
        yield counter("lightspeed:prefix_cache_query_tokens", "Prompt tokens looked up in the prefix cache.",
                      get("prefix_query_tokens"))
        yield counter("lightspeed:engine_steps", "Engine steps run.", get("num_steps"))
        yield counter("lightspeed:engine_restarts", "Times the supervisor restarted a dead engine core.",
                      get("engine_restarts"))
        yield gauge("lightspeed:gateway_inflight_requests", "Engine streams the gateway is reading.",
                    get("gateway_inflight_requests"))
        yield gauge("lightspeed:gateway_waiting_sequences", "Admitted sequences without their first token.",
                    get("gateway_waiting_sequences"))
        yield gauge("lightspeed:gateway_tasks", "asyncio tasks alive in the gateway.", get("gateway_tasks"))
        yield from self._tiers(get, labels)

    @staticmethod
    def _tiers(get, labels):
        """Per KV tier (device, host pinned memory, disk): prefix hits and bytes moved."""
        hits = CounterMetricFamily("lightspeed:prefix_cache_hit_tokens_by_tier",
                                   "Prompt tokens served from the prefix cache, by the KV tier they came from.",
                                   labels=[*labels[0], "tier"])
        for tier in ("device", "host", "disk"):
            hits.add_metric([*labels[1], tier], float(get(f"{tier}_hit_tokens")))
        yield hits
        moved = CounterMetricFamily("lightspeed:kv_tier_bytes",
                                    "KV bytes written to / read from the host and disk tiers.",
                                    labels=[*labels[0], "tier", "direction"])
        for tier in ("host", "disk"):
            for direction in ("written", "read"):
                moved.add_metric([*labels[1], tier, direction], float(get(f"{tier}_bytes_{direction}")))
        yield moved
        for name, doc in (("disk_read_failures", "Disk KV records that failed their checks (recomputed)."),
                          ("disk_write_errors", "Disk KV writes that failed (the first one stops disk writes).")):
            family = CounterMetricFamily(f"lightspeed:kv_{name}", doc, labels=labels[0])
            family.add_metric(labels[1], float(get(name)))
            yield family
        pages = GaugeMetricFamily("lightspeed:kv_cache_disk_pages", "Prefix-cache pages on disk.", labels=labels[0])
        pages.add_metric(labels[1], float(get("cached_disk_pages")))
        yield pages


class GatewayMetrics:
    def __init__(self, model_name: str, read_stats: Callable[[], Any]) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry
        self.requests = Counter("lightspeed:request_success", "Finished requests by finish reason.",
                                ["model_name", "finished_reason"], registry=r)
        self.errors = Counter("lightspeed:request_errors", "Requests answered with an error, by status.",
                              ["model_name", "status"], registry=r)
        self.prompt_tokens = Counter("lightspeed:prompt_tokens", "Prompt tokens of finished requests.",
                                     labels, registry=r)
        self.generation_tokens = Counter("lightspeed:generation_tokens", "Generated tokens.", labels, registry=r)
        self.cached_tokens = Counter("lightspeed:request_cached_tokens",
                                     "Prompt tokens of requests served from the prefix cache.", labels, registry=r)
        self.ttft = Histogram("lightspeed:time_to_first_token_seconds", "Time to first token.", labels,
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("lightspeed:inter_token_latency_seconds", "Time between streamed token batches.",
                             labels, buckets=_TOKEN_BUCKETS, registry=r)
        self.e2e = Histogram("lightspeed:e2e_request_latency_seconds", "Arrival to last token.", labels,
                             buckets=_LATENCY_BUCKETS, registry=r)
        r.register(EngineStatsCollector(read_stats, model_name))
        self.model = model_name

    def observe_request(self, timing: Any, prompt_tokens: int, completion_tokens: int, cached_tokens: int,
                        finish_reasons: list[str]) -> None:
        m = self.model
        if timing.first_token is not None:
            self.ttft.labels(m).observe(timing.first_token - timing.arrival)
            if timing.last_token is not None:
                self.e2e.labels(m).observe(timing.last_token - timing.arrival)
                itl = self.itl.labels(m)
                for gap in timing.gaps:
                    itl.observe(gap)
        self.prompt_tokens.labels(m).inc(prompt_tokens)
        self.generation_tokens.labels(m).inc(completion_tokens)
        self.cached_tokens.labels(m).inc(cached_tokens)
        for reason in finish_reasons:
            self.requests.labels(m, reason or "abort").inc()
