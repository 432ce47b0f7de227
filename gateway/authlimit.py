"""Failed authentications, limited per client address and per API key id.

Pure over plain data and an explicit clock. Every refused credential charges one unit to the
bucket of the client's address and, for an API key, to the bucket of its key id; while either
bucket is empty, further attempts are refused with 429 and `Retry-After` before the credential
is looked at (no registry read, no hash). The address limit stops one client from guessing;
the key id limit stops many addresses guessing one key's secret, at the price that the key's
owner is refused too while the attack lasts (tokens already issued keep working).

These buckets are one replica's own: the gateway keeps them in the shared store
(`gateway.sharedlimits`) and uses these while it is unreachable or when none is configured
(`gateway.limits`). Secrets are 256 bits, so the limits protect the registry and the logs,
not the secrets. Buckets that refilled are forgotten, and at most `MAX_TRACKED_BUCKETS` are
kept, so a flood of fresh addresses or key ids cannot grow memory without bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.ratelimit import Decision, TokenBucket

MAX_TRACKED_BUCKETS = 100_000


def _charge(buckets: dict[str, TokenBucket], name: str, capacity: float, now: float) -> None:
    bucket = buckets.get(name)
    if bucket is None:
        if len(buckets) >= MAX_TRACKED_BUCKETS:
            _prune(buckets, now)
        bucket = buckets[name] = TokenBucket.full(capacity, now)
    bucket.refill(now)
    bucket.level = max(0.0, bucket.level - 1.0)


def _prune(buckets: dict[str, TokenBucket], now: float) -> None:
    """Forget refilled buckets; if that frees nothing, the oldest tenth (insertion order)."""
    for name, bucket in list(buckets.items()):
        bucket.refill(now)
        if bucket.level >= bucket.capacity:
            del buckets[name]
    if len(buckets) >= MAX_TRACKED_BUCKETS:
        for name in list(buckets)[: MAX_TRACKED_BUCKETS // 10]:
            del buckets[name]


def _wait(buckets: dict[str, TokenBucket], name: str | None, now: float) -> float:
    bucket = buckets.get(name) if name is not None else None
    return 0.0 if bucket is None else bucket.wait_for(1.0, now)


def auth_decision(client_wait: float, key_wait: float) -> Decision:
    """Refused while the client's or the key's bucket has less than one attempt left."""
    if client_wait > 0:
        return Decision(False, "too many failed authentications from this client", client_wait)
    if key_wait > 0:
        return Decision(False, "too many failed authentications for this API key", key_wait)
    return Decision(True)


@dataclass
class FailedAuthLimiter:
    """Token buckets of failed authentications per client address and per key id."""

    per_client_per_minute: int
    per_key_per_minute: int
    _clients: dict[str, TokenBucket] = field(default_factory=dict)
    _keys: dict[str, TokenBucket] = field(default_factory=dict)

    def check(self, client: str, key_id: str | None, now: float) -> Decision:
        """Whether a credential from `client` (for `key_id`, if an API key) may be checked."""
        return auth_decision(_wait(self._clients, client, now), _wait(self._keys, key_id, now))

    def failed(self, client: str, key_id: str | None, now: float) -> None:
        """Charge one refused credential to its client and key id."""
        _charge(self._clients, client, self.per_client_per_minute, now)
        if key_id is not None:
            _charge(self._keys, key_id, self.per_key_per_minute, now)

    @property
    def tracked(self) -> int:
        """Buckets held now (clients and key ids)."""
        return len(self._clients) + len(self._keys)
