"""Per-key limits as token buckets: requests per minute, tokens per minute, concurrent streams.

Pure over plain data and an explicit clock. A request and an estimate of its prompt's tokens
are charged on admission, so streams admitted together see each other's prompts; when the
stream ends its real usage replaces the estimate. A key may overdraw once and then waits until
the bucket refills. These buckets are one replica's own: the gateway keeps them in the shared
store (`gateway.sharedlimits`, the same arithmetic) and uses these while the store is
unreachable or when none is configured (`gateway.limits`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

SECONDS_PER_MINUTE = 60.0
DEFAULT_MAX_CONCURRENT_STREAMS = 64
PROMPT_CHARS_PER_TOKEN_ESTIMATE = 4
"""What a prompt is charged at admission, before an agent counts it: OpenAI's rule of thumb."""


def prompt_tokens_estimate(prompt_chars: int) -> int:
    """The tokens a prompt of `prompt_chars` characters is charged until an agent counts it."""
    return -(-prompt_chars // PROMPT_CHARS_PER_TOKEN_ESTIMATE)


@dataclass(slots=True)
class TokenBucket:
    """`capacity` units, refilled continuously at `capacity` per minute."""

    capacity: float
    level: float
    updated_at: float

    @classmethod
    def full(cls, capacity: float, now: float) -> TokenBucket:
        """A bucket at capacity."""
        return cls(capacity, capacity, now)

    def refill(self, now: float) -> None:
        """Add what accrued since the last update."""
        elapsed = max(0.0, now - self.updated_at)
        self.level = min(self.capacity, self.level + elapsed * self.capacity / SECONDS_PER_MINUTE)
        self.updated_at = now

    def wait_for(self, amount: float, now: float) -> float:
        """Seconds until `amount` is available (0 if it is now)."""
        self.refill(now)
        missing = amount - self.level
        return 0.0 if missing <= 0 else missing * SECONDS_PER_MINUTE / self.capacity


@dataclass(frozen=True, slots=True)
class Limits:
    """A key's limits; None means unlimited."""

    rpm: int | None = None
    tpm: int | None = None
    max_concurrent: int = DEFAULT_MAX_CONCURRENT_STREAMS


@dataclass(frozen=True, slots=True)
class Decision:
    """Admitted, or refused with the reason and how long to wait."""

    admitted: bool
    reason: str = ""
    retry_after: float = 0.0


def streams_refusal(limits: Limits) -> Decision:
    """A key at its concurrent streams limit."""
    return Decision(False, f"at most {limits.max_concurrent} concurrent streams", 1.0)


def tpm_refusal(limits: Limits, wait: float) -> Decision:
    """A key that overdrew its tokens per minute, for `wait` seconds more."""
    return Decision(False, f"over {limits.tpm} tokens per minute", wait)


def rpm_refusal(limits: Limits, wait: float) -> Decision:
    """A key out of requests per minute, for `wait` seconds more."""
    return Decision(False, f"over {limits.rpm} requests per minute", wait)


@dataclass(slots=True)
class _KeyState:
    requests: TokenBucket | None
    tokens: TokenBucket | None
    streams: int = 0


@dataclass
class RateLimiter:
    """Buckets per key id."""

    _keys: dict[str, _KeyState] = field(default_factory=dict)

    def _state(self, key_id: str, limits: Limits, now: float) -> _KeyState:
        state = self._keys.get(key_id)
        if state is None:
            state = _KeyState(
                TokenBucket.full(limits.rpm, now) if limits.rpm else None,
                TokenBucket.full(limits.tpm, now) if limits.tpm else None,
            )
            self._keys[key_id] = state
        return state

    def admit(self, key_id: str, limits: Limits, now: float, tokens: int = 0) -> Decision:
        """Take one request, one stream slot and `tokens`, or say why not and for how long.

        `tokens` (the prompt's estimate) is charged once the stream is admitted; a key whose
        bucket is not overdrawn is admitted whatever the estimate.
        """
        state = self._state(key_id, limits, now)
        if state.streams >= limits.max_concurrent:
            return streams_refusal(limits)
        if state.tokens is not None and (wait := state.tokens.wait_for(0.0, now)) > 0:
            return tpm_refusal(limits, wait)
        if state.requests is not None:
            wait = state.requests.wait_for(1.0, now)
            if wait > 0:
                return rpm_refusal(limits, wait)
            state.requests.level -= 1.0
        if state.tokens is not None:
            state.tokens.level -= tokens
        state.streams += 1
        return Decision(True)

    def finish(self, key_id: str, tokens_used: int, now: float) -> None:
        """Release the stream slot and charge `tokens_used` (less than 0: a refund)."""
        state = self._keys.get(key_id)
        if state is None:
            return
        state.streams = max(0, state.streams - 1)
        if state.tokens is not None:
            state.tokens.refill(now)
            state.tokens.level -= tokens_used
