"""Usage per API key and model: counted per minute by each gateway, added to the `usage` table.

Each finished stream adds its prompt and completion tokens to the counts of its key, model
and minute here; every `USAGE_FLUSH_SECONDS` (and when the gateway stops) the counts are
added to the registry's `usage` table with atomic adds, so the replicas' counts of a minute
sum there; counts whose write fails are kept for the next flush. A gateway killed outright
loses at most its last `USAGE_FLUSH_SECONDS` of counts. Prometheus gets the same tokens and
streams per model only (`spotgate_gateway_usage_*`): keys are for the table, not for labels.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from gateway.auth import REGISTRY_FAILURES
from gateway.metrics import GatewayMetrics
from spotgate.logging import get_logger
from spotgate.registry import Registry, UsageCounts, minute_of

log = get_logger(__name__)

USAGE_FLUSH_SECONDS = 10.0
"""How often a gateway adds what it counted to the `usage` table."""

Bucket = tuple[str, str, int]
"""(key id, model, minute)."""


@dataclass
class UsageMeter:
    """Counts per key, model and minute, not yet written."""

    metrics: GatewayMetrics
    pending: defaultdict[Bucket, UsageCounts] = field(
        default_factory=lambda: defaultdict(UsageCounts)
    )

    def record(
        self, key_id: str, model: str, prompt_tokens: int, completion_tokens: int, at: float
    ) -> None:
        """Count one finished stream."""
        self.pending[(key_id, model, minute_of(at))] += UsageCounts(
            prompt_tokens, completion_tokens, 1
        )
        self.metrics.usage_tokens.labels(model=model, kind="prompt").inc(prompt_tokens)
        self.metrics.usage_tokens.labels(model=model, kind="completion").inc(completion_tokens)
        self.metrics.usage_streams.labels(model=model).inc()

    async def flush(self, registry: Registry) -> None:
        """Add the counts to the `usage` table; what a failure leaves unwritten waits for next time.

        Cancelled (the gateway stopping), the counts not yet written go back too, for the
        last flush.
        """
        taken, self.pending = self.pending, defaultdict(UsageCounts)
        unwritten = list(taken.items())
        try:
            while unwritten:
                (key_id, model, minute), counts = unwritten[0]
                await registry.add_usage(key_id, model, minute, counts)
                unwritten.pop(0)
        except REGISTRY_FAILURES as err:
            log.warning("usage not written; kept for the next flush", error=str(err))
        finally:
            for bucket, counts in unwritten:
                self.pending[bucket] += counts
