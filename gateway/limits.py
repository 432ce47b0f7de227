"""Per-key limits and failed-auth budgets as the handlers see them: shared, or this replica's own.

With a limit store configured (`LimitStoreSettings.url`) every decision is taken in it
(`gateway.sharedlimits`), so a key's limits hold however its traffic is spread over the
replicas. When a call fails (refused, too slow), this replica decides alone with its own
buckets (`gateway.ratelimit`, `gateway.authlimit`) for `retry_seconds`, says so in
`/readyz` and in `spotgate_gateway_limits_shared`, and goes back to the store by itself once
it answers again. What it admitted alone meanwhile (requests, tokens) is then charged to the
store, so the key's budget is what it really used, whichever way the outage went (a store
cut off keeps its buckets; a store restarted empty learns what each replica gave). Without a
store every replica keeps its own buckets, as before.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from redis.exceptions import RedisClusterException, RedisError

from gateway.authlimit import FailedAuthLimiter
from gateway.fair_share import FAIR_SHARE_STALE_SECONDS, Loads, decode_loads, encode_loads, summed
from gateway.metrics import GatewayMetrics
from gateway.ratelimit import Decision, Limits, RateLimiter
from gateway.sharedlimits import LEASE_RENEW_SECONDS, SharedBuckets
from gateway.unique import unique_id
from spotgate.logging import get_logger
from spotgate.settings import GatewaySettings

log = get_logger(__name__)

STORE_ERRORS = (RedisError, RedisClusterException, OSError, TimeoutError)
"""What a call to the store raises when it cannot answer: this replica decides alone.

`RedisClusterException` (no node of a cluster-mode endpoint reachable) is not a `RedisError`.
"""

Answer = TypeVar("Answer")


class _Unanswered(enum.Enum):
    UNANSWERED = enum.auto()


UNANSWERED = _Unanswered.UNANSWERED
"""What `LimitStore` takes from the store when there is none, or it is failing."""


@dataclass(frozen=True, slots=True)
class Admission:
    """A stream's admission, and where its slot is held until it finishes."""

    decision: Decision
    key_id: str
    limits: Limits
    # The stream's lease in the store; None when this replica's own buckets admitted it.
    lease: str | None = None
    # Tokens charged at admission (the prompt's estimate); the stream's end settles the rest.
    tokens_charged: int = 0

    @property
    def admitted(self) -> bool:
        """Whether the stream may start."""
        return self.decision.admitted


@dataclass(slots=True)
class LocalCharges:
    """What this replica admitted for one key on its own, not yet charged in the store."""

    limits: Limits
    at: float  # the gateway's clock at the last of them
    requests: int = 0
    tokens: int = 0


@dataclass(slots=True)
class StoreHealth:
    """Whether to ask the store now: not for `retry_seconds` after it last failed."""

    retry_seconds: float
    failed_at: float | None = None
    error: str | None = None

    def usable(self, now: float) -> bool:
        """True unless the store failed less than `retry_seconds` ago."""
        return self.failed_at is None or now - self.failed_at >= self.retry_seconds

    def failed(self, error: str, now: float) -> bool:
        """Record a failure; True when the store was answering until now."""
        was_answering = self.error is None
        self.failed_at, self.error = now, error
        return was_answering

    def answered(self) -> bool:
        """Record an answer; True when the store was failing until now."""
        was_failing = self.error is not None
        self.failed_at, self.error = None, None
        return was_failing


@dataclass
class LimitStore:
    """Per-key limits and failed-auth budgets: in the shared store, or this replica's own."""

    settings: GatewaySettings
    metrics: GatewayMetrics
    shared: SharedBuckets | None = None
    monotonic: Callable[[], float] = time.monotonic
    local: RateLimiter = field(default_factory=RateLimiter)
    failed_auth: FailedAuthLimiter = field(init=False)
    health: StoreHealth = field(init=False)
    _leases: defaultdict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    _unsynced: dict[str, LocalCharges] = field(default_factory=dict)
    _fair_models: set[str] = field(default_factory=set)  # models whose loads it last shared

    def __post_init__(self) -> None:
        self.failed_auth = FailedAuthLimiter(
            self.settings.failed_auth_per_client_per_minute,
            self.settings.failed_auth_per_key_per_minute,
        )
        self.health = StoreHealth(self.settings.limit_store.retry_seconds)
        self.metrics.limits_shared.set(1 if self.shared is not None else 0)

    @property
    def status(self) -> str:
        """`shared`; `local` while the store does not answer; `per-replica` without one."""
        if self.shared is None:
            return "per-replica"
        return "local" if self.health.error is not None else "shared"

    async def _ask(
        self, question: Callable[[SharedBuckets], Awaitable[Answer]], *, always: bool = False
    ) -> Answer | _Unanswered:
        """The store's answer; `UNANSWERED` without a store, or while or when it fails.

        `always`: ask even inside the retry interval (what the store already holds: a slot
        to give back, a lease to renew).
        """
        if self.shared is None:
            return UNANSWERED
        if not always and not self.health.usable(self.monotonic()):
            return UNANSWERED
        try:
            if self._unsynced:  # before anything new: the key's budget as it really stands
                await self._charge_unsynced(self.shared)
            answer = await question(self.shared)
        except STORE_ERRORS as err:
            self.metrics.limit_store_errors.inc()
            # The class only: `/readyz` shows it, and the message names internal hosts.
            if self.health.failed(type(err).__name__, self.monotonic()):
                self.metrics.limits_shared.set(0)
                log.warning(
                    "limit store unreachable: this replica's own limits until it answers",
                    error=f"{type(err).__name__}: {err}",
                )
            return UNANSWERED
        if self.health.answered():
            self.metrics.limits_shared.set(1)
            log.info("limit store answers again: limits shared by every replica")
        return answer

    def _charged_locally(
        self, key_id: str, limits: Limits, requests: int, tokens: int, now: float
    ) -> None:
        """Remember what this replica's own buckets gave, to charge in the store later."""
        if self.shared is None:
            return
        charges = self._unsynced.setdefault(key_id, LocalCharges(limits, now))
        charges.limits, charges.at = limits, max(charges.at, now)
        charges.requests += requests
        charges.tokens += tokens

    async def _charge_unsynced(self, shared: SharedBuckets) -> None:
        """Charge the store what this replica admitted alone; what fails waits, and raises.

        Each key's charges leave the list before they are sent, so calls running at once
        never send the same ones twice.
        """
        for key_id in list(self._unsynced):
            charges = self._unsynced.pop(key_id, None)
            if charges is None:
                continue
            try:
                await shared.charge(
                    key_id, charges.limits, charges.requests, charges.tokens, charges.at
                )
            except STORE_ERRORS:
                self._charged_locally(
                    key_id, charges.limits, charges.requests, charges.tokens, charges.at
                )
                raise

    async def admit(self, key_id: str, limits: Limits, now: float, tokens: int = 0) -> Admission:
        """Take one request, one stream slot and `tokens` for `key_id`, or say why not."""
        lease = unique_id()
        decision = await self._ask(lambda store: store.admit(key_id, limits, now, lease, tokens))
        if decision is UNANSWERED:
            self.metrics.local_limit_decisions.inc()
            local = self.local.admit(key_id, limits, now, tokens)
            if local.admitted:
                self._charged_locally(key_id, limits, 1, tokens, now)
            return Admission(local, key_id, limits, tokens_charged=tokens if local.admitted else 0)
        if not decision.admitted:
            return Admission(decision, key_id, limits)
        self._leases[key_id].add(lease)
        return Admission(decision, key_id, limits, lease, tokens)

    async def finish(self, admission: Admission, tokens_used: int, now: float) -> None:
        """Release the stream's slot and charge what it used, less what admission charged.

        Asked even while the store was failing lately; if it fails now, the slot frees when
        its lease lapses and the tokens go uncharged: the stream is over either way.
        """
        key_id, lease = admission.key_id, admission.lease
        owed = tokens_used - admission.tokens_charged
        if lease is None:
            self.local.finish(key_id, owed, now)
            self._charged_locally(key_id, admission.limits, 0, owed, now)
            return
        held = self._leases[key_id]
        held.discard(lease)
        if not held:
            del self._leases[key_id]
        await self._ask(
            lambda store: store.finish(key_id, admission.limits, owed, now, lease),
            always=True,
        )

    async def auth_check(self, client: str, key_id: str | None, now: float) -> Decision:
        """Whether a credential from `client` (for `key_id`, if an API key) may be checked."""
        per_client, per_key = self._auth_budgets()
        decision = await self._ask(
            lambda store: store.auth_check(client, key_id, now, per_client, per_key)
        )
        if decision is UNANSWERED:
            return self.failed_auth.check(client, key_id, now)
        return decision

    async def auth_failed(self, client: str, key_id: str | None, now: float) -> None:
        """Charge one refused credential to its client and key id."""
        per_client, per_key = self._auth_budgets()
        answered = await self._ask(
            lambda store: store.auth_failed(client, key_id, now, per_client, per_key)
        )
        if answered is UNANSWERED:
            self.failed_auth.failed(client, key_id, now)

    def _auth_budgets(self) -> tuple[int, int]:
        return (
            self.settings.failed_auth_per_client_per_minute,
            self.settings.failed_auth_per_key_per_minute,
        )

    async def exchange_fair_loads(
        self, replica: str, mine: Mapping[str, Loads], now: float, reading: Iterable[str] = ()
    ) -> dict[str, Loads]:
        """Share this replica's tenants' streams per model; the other replicas', summed.

        Others' are read for those models and for `reading`. A model it shared before and has
        no streams of now is withdrawn. Without a store, or while it fails, there are no
        others: each replica's queue is fair on its own.
        """
        models = set(mine) | self._fair_models | set(reading)
        self._fair_models = set(mine)
        others: dict[str, Loads] = {}
        for model in sorted(models):
            shared = encode_loads(mine[model]) if model in mine else ""
            exchange = partial(
                SharedBuckets.exchange_loads,
                model=model,
                replica=replica,
                mine=shared,
                now=now,
                stale_seconds=FAIR_SHARE_STALE_SECONDS,
            )
            answer = await self._ask(exchange)
            if not isinstance(answer, _Unanswered) and answer:
                others[model] = summed(decode_loads(text) for text in answer)
        return others

    async def _renew_leases(self) -> None:
        held = {key_id: sorted(leases) for key_id, leases in self._leases.items()}
        if held:
            await self._ask(lambda store: store.renew(held), always=True)

    async def maintain_forever(self) -> None:
        """Renew the leases of the streams in flight, and ask a failing store again."""
        if self.shared is None:
            return
        interval = min(LEASE_RENEW_SECONDS, self.settings.limit_store.retry_seconds)
        renewed_at = self.monotonic()
        while True:
            await asyncio.sleep(interval)
            if self.health.error is not None:
                await self._ask(lambda store: store.ping())
            if self.monotonic() - renewed_at >= LEASE_RENEW_SECONDS:
                await self._renew_leases()
                renewed_at = self.monotonic()
