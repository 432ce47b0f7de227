"""Prometheus metrics of one agent, in their own registry (units in names)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from gpu_agent.engine import PrefixCacheCounts

TTFT_BUCKETS_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class PrefixCacheCollector(Collector):
    """The engine's prefix-cache counts as two counters, read at each scrape."""

    def __init__(self, counts: Callable[[], PrefixCacheCounts]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        """The counts now."""
        counts = self._counts()
        yield CounterMetricFamily(
            "spotgate_agent_prefix_cache_queried_tokens_total",
            "prompt tokens looked up in the engine's prefix cache",
            value=counts.queried_tokens,
        )
        yield CounterMetricFamily(
            "spotgate_agent_prefix_cache_hit_tokens_total",
            "prompt tokens found in it",
            value=counts.hit_tokens,
        )


@dataclass
class AgentMetrics:
    """The agent's counters, gauges and histograms."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    prefix_cache: Callable[[], PrefixCacheCounts] = PrefixCacheCounts
    """Reads the engine's prefix-cache counts at each scrape; by default zeros (no engine)."""

    def __post_init__(self) -> None:
        r = self.registry
        self.ready = Gauge(
            "spotgate_agent_ready", "1 while the agent takes new streams", registry=r
        )
        self.active_streams = Gauge(
            "spotgate_agent_active_streams", "streams being generated", registry=r
        )
        self.streams = Counter(
            "spotgate_agent_streams_total", "finished streams by outcome", ["outcome"], registry=r
        )
        self.tokens = Counter(
            "spotgate_agent_generated_tokens_total", "completion tokens sent", registry=r
        )
        self.ttft = Histogram(
            "spotgate_agent_ttft_seconds",
            "time to first token",
            buckets=TTFT_BUCKETS_SECONDS,
            registry=r,
        )
        self.interruptions = Counter(
            "spotgate_agent_interruptions_total", "spot interruption notices", registry=r
        )
        self.boot = Gauge(
            "spotgate_agent_boot_seconds",
            "from the instance's launch to the end of each boot phase",
            ["phase"],
            registry=r,
        )
        self.engine_stalls = Counter(
            "spotgate_agent_engine_stalls_total",
            "times the engine made no token within the stall limit (the agent then left)",
            registry=r,
        )
        self.registration_failures = Counter(
            "spotgate_agent_registration_failures_total",
            "attempts to register that the registry did not take (tried again)",
            registry=r,
        )
        # Through `self`: the runtime points `prefix_cache` at its engine after this.
        r.register(PrefixCacheCollector(lambda: self.prefix_cache()))
