"""Usage per API key and model: counted per minute by each gateway, added to the `usage` table.

Each finished stream adds its prompt and completion tokens to the counts of its key, model
and minute here; every `USAGE_FLUSH_SECONDS` (and when the gateway stops) the counts are
added to the registry's `usage` table with atomic adds, so the replicas' counts of a minute
sum there; a write whose outcome is unknown is sent again, and the table takes it once. A
gateway killed outright loses at most its last `USAGE_FLUSH_SECONDS` of counts. Prometheus
gets the same tokens and streams per model only (`spotgate_gateway_usage_*`): keys are for
the table, not for labels.
"""

from __future__ import annotations

import secrets
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
    unsent: dict[str, tuple[Bucket, UsageCounts]] = field(default_factory=dict)
    """Writes made and not known to be in the table, by write id."""

    def record(
        self,
        key_id: str,
        model: str,
        prompt_tokens: int,
        completion_tokens: int,
        at: float,
        *,
        flex: bool = False,
    ) -> None:
        """Count one finished stream (`flex`: its tokens are flex tokens too)."""
        flex_tokens = prompt_tokens + completion_tokens if flex else 0
        self.pending[(key_id, model, minute_of(at))] += UsageCounts(
            prompt_tokens, completion_tokens, 1, flex_tokens
        )
        self.metrics.usage_tokens.labels(model=model, kind="prompt").inc(prompt_tokens)
        self.metrics.usage_tokens.labels(model=model, kind="completion").inc(completion_tokens)
        self.metrics.usage_streams.labels(model=model).inc()

    async def flush(self, registry: Registry) -> None:
        """Add the counts to the `usage` table; what is not known written waits for next time.

        Each bucket's counts become a write with an id of its own, sent until the table
        has it: resent after a failure, a timeout or a cancellation (the gateway stopping),
        the table takes it once.
        """
        for bucket, counts in self.pending.items():
            self.unsent[secrets.token_hex(8)] = (bucket, counts)
        self.pending.clear()
        try:
            for write_id, ((key_id, model, minute), counts) in list(self.unsent.items()):
                await registry.add_usage(key_id, model, minute, counts, write_id)
                del self.unsent[write_id]
        except REGISTRY_FAILURES as err:
            log.warning("usage not written; kept for the next flush", error=str(err))
