"""Prometheus metrics of one gateway (units in names)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from gateway.dispatch import PoolView
    from gateway.relay import RelayOutcome

LATENCY_BUCKETS_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120)
ADDED_LATENCY_BUCKETS_SECONDS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1
)  # fmt: skip


@dataclass
class GatewayMetrics:
    """The gateway's counters, gauges and histograms."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self._stream_metrics(self.registry)
        self._move_metrics(self.registry)
        self._pool_metrics(self.registry)
        self._limit_metrics(self.registry)

    def _stream_metrics(self, r: CollectorRegistry) -> None:
        """The streams relayed and refused: how many, their tokens, latencies and usage."""
        self.active_streams = Gauge(
            "spotgate_gateway_active_streams", "streams being relayed", registry=r
        )
        self.tokens = Counter(
            "spotgate_gateway_relayed_tokens_total", "completion tokens relayed", registry=r
        )
        self.ttft = Histogram(
            "spotgate_gateway_ttft_seconds",
            "time to first token, queueing included",
            buckets=LATENCY_BUCKETS_SECONDS,
            registry=r,
        )
        self.added_ttft = Histogram(
            "spotgate_gateway_added_ttft_seconds",
            "the gateway's own share of time to first token: from the request to the agent "
            "having it, and from the agent's first token to the client's writer (streams "
            "placed without queueing)",
            buckets=ADDED_LATENCY_BUCKETS_SECONDS,
            registry=r,
        )
        self.queue_time = Histogram(
            "spotgate_gateway_queue_seconds",
            "time waiting for an agent",
            buckets=LATENCY_BUCKETS_SECONDS,
            registry=r,
        )
        self.rejections = Counter(
            "spotgate_gateway_rejections_total",
            "refused requests by reason",
            ["reason"],
            registry=r,
        )
        self.usage_tokens = Counter(
            "spotgate_gateway_usage_tokens_total",
            "tokens of finished streams by model and kind (prompt, completion); per API key: "
            "`spotgate keys usage`",
            ["model", "kind"],
            registry=r,
        )
        self.usage_streams = Counter(
            "spotgate_gateway_usage_streams_total",
            "finished streams by model",
            ["model"],
            registry=r,
        )

    def _move_metrics(self, r: CollectorRegistry) -> None:
        """Streams moved to another agent, and the checks of their next agents."""
        self.resumes = Counter(
            "spotgate_gateway_resumes_total", "streams moved to another agent", registry=r
        )
        self.preemptions = Counter(
            "spotgate_gateway_preemptions_total",
            "flex streams stopped for a waiting interactive one, to resume once placed again",
            registry=r,
        )
        self.early_moves = Counter(
            "spotgate_gateway_early_moves_total",
            "streams moved make-before-break: their continuation prefilled on the next agent "
            "while the draining one streamed on (also counted in resumes)",
            registry=r,
        )
        self.early_move_checked_tokens = Counter(
            "spotgate_gateway_early_move_checked_tokens_total",
            "tokens of next agents compared with those the client held, in moves begun "
            "before the break (their repeats, dropped)",
            registry=r,
        )
        self.early_move_divergences = Counter(
            "spotgate_gateway_early_move_divergences_total",
            "early moves whose next agent went another way than the client's tokens "
            "(batch-dependent numerics): dropped, the stream moved at the break",
            registry=r,
        )

    def _pool_metrics(self, r: CollectorRegistry) -> None:
        """The agents and registry as this replica sees them, and what agents were caught at."""
        self.agents = Gauge(
            "spotgate_gateway_agents",
            "agents in the registry view by state",
            ["state"],
            registry=r,
        )
        self.registry_up = Gauge(
            "spotgate_gateway_registry_up", "1 while the registry answers", registry=r
        )
        self.prefix_index_blocks = Gauge(
            "spotgate_gateway_prefix_index_blocks",
            "prompt blocks this replica remembers sending to agents, over every agent "
            "(at most prefix_blocks_per_agent each)",
            registry=r,
        )
        self.rogue_agents = Counter(
            "spotgate_gateway_rogue_agents_total",
            "agent rows and reports not taken at their word: rows not routed (unknown_agent, "
            "other_model, other_url) or capped (capacity), once per agent; streams whose "
            "reported usage was capped to what the gateway measured (prompt_tokens, "
            "completion_tokens)",
            ["reason"],
            registry=r,
        )

    def _limit_metrics(self, r: CollectorRegistry) -> None:
        """Where per-key limits are decided, and how often the shared store failed."""
        self.limits_shared = Gauge(
            "spotgate_gateway_limits_shared",
            "1 while per-key limits are decided in the limit store shared by every replica; "
            "0 while this replica decides alone (no store configured, or it does not answer)",
            registry=r,
        )
        self.limit_store_errors = Counter(
            "spotgate_gateway_limit_store_errors_total",
            "calls to the limit store that failed (refused, or too slow)",
            registry=r,
        )
        self.local_limit_decisions = Counter(
            "spotgate_gateway_local_limit_decisions_total",
            "admissions decided by this replica's own buckets "
            "(no limit store, or it did not answer)",
            registry=r,
        )

    def record(self, outcome: RelayOutcome) -> None:
        """Account for a finished stream."""
        self.tokens.inc(outcome.relayed_tokens)
        self.queue_time.observe(outcome.queue_ms / 1000)
        if outcome.ttft_ms is not None:
            self.ttft.observe(outcome.ttft_ms / 1000)
        if outcome.added_ttft_ms is not None:
            self.added_ttft.observe(outcome.added_ttft_ms / 1000)
        # A next agent dropped before the switch is no early move, but its check counts.
        # Most streams have none of these: a counter's `inc` takes a lock, even for 0.
        for counter, amount in (
            (self.resumes, outcome.resumes),
            (self.early_moves, outcome.early_moves),
            (self.preemptions, outcome.preemptions),
            (self.early_move_checked_tokens, outcome.early_move_checked_tokens),
            (self.early_move_divergences, outcome.early_move_diverged),
        ):
            if amount:
                counter.inc(amount)
        if outcome.error is not None:
            self.rejections.labels(reason=outcome.error.value).inc()

    def observe_view(self, view: PoolView, registry_up: bool) -> None:
        """Agents by state, and whether the registry answers."""
        counts: dict[str, int] = {}
        for records in view.agents.values():
            for record in records:
                counts[record.state.value] = counts.get(record.state.value, 0) + 1
        for state in ("starting", "ready", "draining", "gone"):
            self.agents.labels(state=state).set(counts.get(state, 0))
        self.registry_up.set(1 if registry_up else 0)
