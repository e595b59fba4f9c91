"""Prometheus metrics, names prefixed `lightspeed:`. One registry per app (tests start several)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                    40.0, 80.0)
_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)


class EngineStatsCollector:
    """Reads the engine's stats snapshot at scrape time: gauges and the engine's own counters, one
    series per engine core (label `engine`, its data-parallel rank, as vLLM labels them)."""

    def __init__(self, read_stats: Callable[[], Any], model_name: str) -> None:
        self._read_stats = read_stats
        self._model = model_name

    def collect(self):
        stats = self._read_stats()
        if not stats:
            return
        listed = [(str(r.get("dp_rank", i)), r) for i, r in enumerate(stats.get("ranks") or [stats])]
        ranks = [(engine, r) for engine, r in listed if "num_running" in r]
        if not ranks:
            return  # no snapshot from the core yet: no number beats a wrong zero
        labels = ["model_name", "engine"]

        def family(kind, name: str, doc: str, key: str, over=None):
            metric = kind(name, doc, labels=labels)
            for engine, snap in ranks if over is None else over:
                metric.add_metric([self._model, engine], float(snap.get(key) or 0))
            return metric

        gauge, counter = GaugeMetricFamily, CounterMetricFamily
        yield family(gauge, "lightspeed:num_requests_running", "Requests prefilling or decoding in the engine.",
                     "num_running")
        yield family(gauge, "lightspeed:num_requests_waiting", "Requests waiting for the scheduler.", "num_waiting")
        yield family(gauge, "lightspeed:num_requests_retracted", "Requests swapped out under memory pressure.",
                     "num_retracted")
        yield family(gauge, "lightspeed:kv_cache_usage_perc", "Fraction of device KV-cache pages held by requests "
                     "(0..1); cached prefix pages no request holds are reusable and count as free.", "kv_usage")
        yield family(gauge, "lightspeed:kv_cache_free_pages", "Free device KV-cache pages.", "free_device_pages")
        yield family(gauge, "lightspeed:kv_cache_cached_pages", "Device KV-cache pages holding prefix-cache entries "
                     "(shared by running requests or kept for reuse).", "cached_device_pages")
        yield family(counter, "lightspeed:prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache.",
                     "prefix_hit_tokens")
        yield family(counter, "lightspeed:prefix_cache_query_tokens", "Prompt tokens looked up in the prefix cache.",
                     "prefix_query_tokens")
        yield family(counter, "lightspeed:engine_steps", "Engine steps run.", "num_steps")
        yield from self._tiers(ranks, family, labels)
        routed = [(engine, snap) for engine, snap in listed if "num_routed_requests" in snap]
        if routed:  # the router's own count: known for a core that has sent no snapshot since its restart
            yield family(counter, "lightspeed:data_parallel_routed_requests",
                         "Requests the router sent to each data-parallel engine core.", "num_routed_requests", routed)
        loads = [(engine, snap["expert_load"]) for engine, snap in ranks if snap.get("expert_load")]
        if loads:
            experts = CounterMetricFamily("lightspeed:moe_expert_tokens",
                                          "Tokens routed to each MoE expert (summed over layers).",
                                          labels=[*labels, "expert"])
            for engine, load in loads:
                for expert, count in enumerate(load):
                    experts.add_metric([self._model, engine, str(expert)], float(count))
            yield experts
        if any(snap.get("spec_acceptance_lengths") for _, snap in ranks):  # speculative decoding is on
            yield from self._speculative(ranks, family, labels)
        yield from self._gateway(stats)

    def _speculative(self, ranks, family, labels):
        counter = CounterMetricFamily
        yield family(counter, "lightspeed:spec_decode_num_drafts", "Decode rows that carried draft tokens.",
                     "spec_num_drafts")
        yield family(counter, "lightspeed:spec_decode_num_draft_tokens", "Draft tokens verified.",
                     "spec_num_draft_tokens")
        yield family(counter, "lightspeed:spec_decode_num_accepted_tokens", "Draft tokens accepted.",
                     "spec_num_accepted_tokens")
        # lengths[n]: rows with drafts that kept n tokens (accepted drafts + the bonus token).
        histogram = HistogramMetricFamily("lightspeed:spec_decode_acceptance_length",
                                          "Tokens a decode row with drafts kept per step (accepted drafts + 1).",
                                          labels=labels)
        for engine, snap in ranks:
            lengths = snap.get("spec_acceptance_lengths") or []
            cumulative, buckets = 0, []
            for n, count in enumerate(lengths[1:], start=1):
                cumulative += count
                buckets.append((str(float(n)), cumulative))
            buckets.append(("+Inf", cumulative))
            histogram.add_metric([self._model, engine], buckets,
                                 sum_value=float(sum(n * c for n, c in enumerate(lengths))))
        yield histogram

    def _gateway(self, stats: dict):
        """The gateway's own series (one per server, whatever the number of engine cores)."""
        for kind, name, doc, key in (
                (CounterMetricFamily, "lightspeed:engine_restarts", "Times the supervisor restarted a dead engine "
                 "core.", "engine_restarts"),
                (GaugeMetricFamily, "lightspeed:gateway_inflight_requests", "Engine streams the gateway is reading.",
                 "gateway_inflight_requests"),
                (GaugeMetricFamily, "lightspeed:gateway_waiting_sequences", "Admitted sequences without their first "
                 "token.", "gateway_waiting_sequences"),
                (GaugeMetricFamily, "lightspeed:gateway_tasks", "asyncio tasks alive in the gateway.", "gateway_tasks")):
            metric = kind(name, doc, labels=["model_name"])
            metric.add_metric([self._model], float(stats.get(key) or 0))
            yield metric

    def _tiers(self, ranks, family, labels):
        """Per KV tier (device, host pinned memory, disk) and engine core: prefix hits and bytes moved."""
        hits = CounterMetricFamily("lightspeed:prefix_cache_hit_tokens_by_tier",
                                   "Prompt tokens served from the prefix cache, by the KV tier they came from.",
                                   labels=[*labels, "tier"])
        moved = CounterMetricFamily("lightspeed:kv_tier_bytes",
                                    "KV bytes written to / read from the host and disk tiers.",
                                    labels=[*labels, "tier", "direction"])
        for engine, snap in ranks:
            for tier in ("device", "host", "disk"):
                hits.add_metric([self._model, engine, tier], float(snap.get(f"{tier}_hit_tokens") or 0))
            for tier in ("host", "disk"):
                for direction in ("written", "read"):
                    moved.add_metric([self._model, engine, tier, direction],
                                     float(snap.get(f"{tier}_bytes_{direction}") or 0))
        yield hits
        yield moved
        yield family(CounterMetricFamily, "lightspeed:kv_disk_read_failures",
                     "Disk KV records that failed their checks (recomputed).", "disk_read_failures")
        yield family(CounterMetricFamily, "lightspeed:kv_disk_write_errors",
                     "Disk KV writes that failed (the first one stops disk writes).", "disk_write_errors")
        yield family(GaugeMetricFamily, "lightspeed:kv_cache_disk_pages", "Prefix-cache pages on disk.",
                     "cached_disk_pages")


class AnswerCacheCollector:
    """The chat renderer's generated-answer counts (template.ChatRenderer.answer_counts)."""

    def __init__(self, read_counts: Callable[[], dict[str, int]], model_name: str) -> None:
        self._read, self._model = read_counts, model_name

    def collect(self):
        counts = dict(self._read())
        metric = CounterMetricFamily("lightspeed:answer_cache_answers",
                                     "Plain generated answers: remembered with their token ids, refused (the ids do "
                                     "not decode to the text), spliced into a later prompt.",
                                     labels=["model_name", "outcome"])
        for outcome in ("remembered", "refused", "spliced"):
            metric.add_metric([self._model, outcome], float(counts.get(outcome, 0)))
        yield metric


class GatewayMetrics:
    def __init__(self, model_name: str, read_stats: Callable[[], Any],
                 read_answer_counts: Callable[[], dict[str, int]] | None = None) -> None:
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
        if read_answer_counts is not None:
            r.register(AnswerCacheCollector(read_answer_counts, model_name))
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
