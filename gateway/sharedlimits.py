"""Per-key limits and failed-auth budgets kept in Redis (or Valkey), shared by every replica.

Each decision is one Lua script, atomic on the server, doing the arithmetic of
`gateway.ratelimit.TokenBucket` on a hash (`level`, `at`): a missing bucket reads as full, and
a bucket expires when it would be full again, so idle keys cost no memory. Buckets refill by
the gateway's clock (`now`, passed in), so the policy and its tests keep one notion of time.

A key's concurrent streams are leases in a sorted set scored by their expiry on the *store's*
clock: the replica that admitted a stream renews its lease while the stream lives and removes
it when it ends, so the streams of a replica that died (`kill -9`) free their slots when
their leases lapse, `STREAM_LEASE_SECONDS` later at most.

Every key of one API key shares a hash tag, so a script touches one slot and the same
scripts run on a cluster-mode endpoint (ElastiCache Serverless).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as StoreConnectionError

from gateway.authlimit import auth_decision
from gateway.ratelimit import (
    SECONDS_PER_MINUTE,
    Decision,
    Limits,
    rpm_refusal,
    streams_refusal,
    tpm_refusal,
)
from spotgate.settings import LimitStoreSettings

STREAM_LEASE_SECONDS = 30.0
"""How long a stream's slot outlives the last renewal by the replica relaying it."""
LEASE_RENEW_SECONDS = 10.0
"""How often a replica renews the leases of the streams it relays."""
KEY_PREFIX = "spotgate"

_BUCKET = (
    f"local MINUTE = {SECONDS_PER_MINUTE}\n"
    + """
local function level(key, capacity, now)
  local stored = redis.call('HMGET', key, 'level', 'at')
  local value = tonumber(stored[1])
  if value == nil then return capacity, now end
  local at = tonumber(stored[2])
  return math.min(capacity, value + math.max(0, now - at) * capacity / MINUTE),
    math.max(now, at)
end
local function store(key, capacity, value, at)
  redis.call('HSET', key, 'level', string.format('%.17g', value),
    'at', string.format('%.17g', at))
  redis.call('PEXPIRE', key, math.ceil((capacity - value) * MINUTE * 1000 / capacity) + 1000)
end
local function number(value) return string.format('%.17g', value) end
local function server_now()
  local time = redis.call('TIME')
  return tonumber(time[1]) + tonumber(time[2]) / 1000000
end
"""
)

_ADMIT = (
    _BUCKET
    + """
-- KEYS: rpm bucket, tpm bucket, stream leases
-- ARGV: now, rpm, tpm, max streams, the lease, its seconds, the prompt's tokens
local now, rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local leases_now = server_now()
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', leases_now)
if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[4]) then return {'streams', '0'} end
if tpm > 0 then
  local value = level(KEYS[2], tpm, now)
  if value < 0 then return {'tpm', number(-value * MINUTE / tpm)} end
end
if rpm > 0 then
  local value, at = level(KEYS[1], rpm, now)
  if value < 1 then return {'rpm', number((1 - value) * MINUTE / rpm)} end
  store(KEYS[1], rpm, value - 1, at)
end
local prompt = tonumber(ARGV[7])
if tpm > 0 and prompt > 0 then
  local value, at = level(KEYS[2], tpm, now)
  store(KEYS[2], tpm, value - prompt, at)
end
redis.call('ZADD', KEYS[3], leases_now + tonumber(ARGV[6]), ARGV[5])
redis.call('EXPIRE', KEYS[3], math.ceil(tonumber(ARGV[6])) + 1)
return {'', '0'}
"""
)

_FINISH = (
    _BUCKET
    + """
-- KEYS: tpm bucket, stream leases; ARGV: now, tpm, tokens used, lease
redis.call('ZREM', KEYS[2], ARGV[4])
local tpm = tonumber(ARGV[2])
if tpm > 0 then
  local value, at = level(KEYS[1], tpm, tonumber(ARGV[1]))
  store(KEYS[1], tpm, value - tonumber(ARGV[3]), at)
end
return 0
"""
)

_RENEW = (
    _BUCKET
    + """
-- KEYS: stream leases; ARGV: lease seconds, then the leases still held
local expiry = server_now() + tonumber(ARGV[1])
for index = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', expiry, ARGV[index]) end
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[1])) + 1)
return 0
"""
)

_CHARGE = (
    _BUCKET
    + """
-- KEYS: rpm bucket, tpm bucket; ARGV: now, rpm, tpm, requests, tokens
local now, rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local requests, tokens = tonumber(ARGV[4]), tonumber(ARGV[5])
if rpm > 0 and requests ~= 0 then
  local value, at = level(KEYS[1], rpm, now)
  store(KEYS[1], rpm, value - requests, at)
end
if tpm > 0 and tokens ~= 0 then
  local value, at = level(KEYS[2], tpm, now)
  store(KEYS[2], tpm, value - tokens, at)
end
return 0
"""
)

_AUTH_WAIT = (
    _BUCKET
    + """
-- KEYS: failed-auth bucket; ARGV: now, capacity
local capacity = tonumber(ARGV[2])
local value = level(KEYS[1], capacity, tonumber(ARGV[1]))
if value >= 1 then return '0' end
return number((1 - value) * MINUTE / capacity)
"""
)

_AUTH_CHARGE = (
    _BUCKET
    + """
-- KEYS: failed-auth bucket; ARGV: now, capacity
local capacity = tonumber(ARGV[2])
local value, at = level(KEYS[1], capacity, tonumber(ARGV[1]))
store(KEYS[1], capacity, math.max(0, value - 1), at)
return 0
"""
)


_EXCHANGE_LOADS = """
-- KEYS: the model's hash of replicas' loads
-- ARGV: now, stale seconds, this replica, its loads ('': none)
local now, stale, me, mine = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4]
if mine == '' then
  redis.call('HDEL', KEYS[1], me)
else
  redis.call('HSET', KEYS[1], me, now .. ' ' .. mine)
end
local all, others = redis.call('HGETALL', KEYS[1]), {}
for i = 1, #all, 2 do
  local cut = string.find(all[i + 1], ' ', 1, true)
  if tonumber(string.sub(all[i + 1], 1, cut - 1)) < now - stale then
    redis.call('HDEL', KEYS[1], all[i])
  elseif all[i] ~= me then
    table.insert(others, string.sub(all[i + 1], cut + 1))
  end
end
redis.call('PEXPIRE', KEYS[1], math.floor(stale * 1000))
return others
"""


def fair_loads_key(model: str) -> str:
    """The hash in which replicas share a model's tenants' streams."""
    return f"spotgate:fair:{{{model}}}"


def key_names(key_id: str) -> tuple[str, str, str]:
    """The rpm bucket, tpm bucket and stream leases of an API key: one hash tag, one slot."""
    tag = f"{KEY_PREFIX}:{{key:{key_id}}}"
    return f"{tag}:rpm", f"{tag}:tpm", f"{tag}:streams"


def client_auth_bucket(client: str) -> str:
    """The failed-auth bucket of a client address."""
    return f"{KEY_PREFIX}:auth:client:{client}"


def key_auth_bucket(key_id: str) -> str:
    """The failed-auth bucket of an API key id."""
    return f"{KEY_PREFIX}:auth:key:{key_id}"


def admit_decision(reason: str, wait: float, limits: Limits) -> Decision:
    """The decision the admit script answered (`reason` empty when admitted)."""
    if reason == "streams":
        return streams_refusal(limits)
    if reason == "tpm":
        return tpm_refusal(limits, wait)
    if reason == "rpm":
        return rpm_refusal(limits, wait)
    return Decision(True)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class SharedBuckets:
    """The limits' scripts on one Redis or Valkey endpoint (standalone or cluster mode)."""

    def __init__(self, client: Redis | RedisCluster) -> None:
        self._client = client
        self._admit: AsyncScript = client.register_script(_ADMIT)
        self._finish: AsyncScript = client.register_script(_FINISH)
        self._renew: AsyncScript = client.register_script(_RENEW)
        self._charge: AsyncScript = client.register_script(_CHARGE)
        self._auth_wait: AsyncScript = client.register_script(_AUTH_WAIT)
        self._auth_charge: AsyncScript = client.register_script(_AUTH_CHARGE)
        self._exchange_loads: AsyncScript = client.register_script(_EXCHANGE_LOADS)

    @classmethod
    @asynccontextmanager
    async def open(cls, settings: LimitStoreSettings) -> AsyncIterator[SharedBuckets]:
        """A client for `settings.url`; calls fail fast so a replica falls back.

        A call that finds its pooled connection closed (the store restarted, a node was
        replaced) is sent once more on a fresh one: only a store that refuses or drops that
        too is down. A call that times out is not sent again: a store that hangs costs one
        timeout per call, not two.
        """
        if settings.url is None:
            raise ValueError("no limit store configured")
        options: dict[str, Any] = {
            "socket_timeout": settings.timeout_seconds,
            "socket_connect_timeout": settings.timeout_seconds,
            "retry": Retry(NoBackoff(), 1, supported_errors=(StoreConnectionError,)),
        }
        url = settings.url.get_secret_value()
        client: Redis | RedisCluster
        if settings.cluster:
            client = RedisCluster.from_url(url, **options)
        else:
            client = Redis.from_url(url, **options)
        try:
            yield cls(client)
        finally:
            await client.aclose()

    async def ping(self) -> None:
        """Raise unless the store answers."""
        await self._client.ping()

    async def admit(
        self, key_id: str, limits: Limits, now: float, lease: str, tokens: int = 0
    ) -> Decision:
        """Take one request, a stream slot held by `lease` and `tokens`, or say why not."""
        reply = await self._admit(
            keys=list(key_names(key_id)),
            args=[
                now,
                limits.rpm or 0,
                limits.tpm or 0,
                limits.max_concurrent,
                lease,
                STREAM_LEASE_SECONDS,
                tokens,
            ],
        )
        reason, wait = (_text(part) for part in reply)
        return admit_decision(reason, float(wait), limits)

    async def finish(
        self, key_id: str, limits: Limits, tokens_used: int, now: float, lease: str
    ) -> None:
        """Release the stream's slot and charge `tokens_used` (less than 0: a refund)."""
        _, tpm_key, streams_key = key_names(key_id)
        await self._finish(
            keys=[tpm_key, streams_key], args=[now, limits.tpm or 0, tokens_used, lease]
        )

    async def charge(
        self, key_id: str, limits: Limits, requests: int, tokens: int, now: float
    ) -> None:
        """Take `requests` and `tokens` a replica admitted on its own while the store was away."""
        rpm_key, tpm_key, _ = key_names(key_id)
        await self._charge(
            keys=[rpm_key, tpm_key],
            args=[now, limits.rpm or 0, limits.tpm or 0, requests, tokens],
        )

    async def renew(self, leases: Mapping[str, Iterable[str]]) -> None:
        """Extend the leases of the streams still relayed, per API key id."""
        for key_id, held in leases.items():
            await self._renew(keys=[key_names(key_id)[2]], args=[STREAM_LEASE_SECONDS, *held])

    async def auth_check(
        self, client: str, key_id: str | None, now: float, per_client: int, per_key: int
    ) -> Decision:
        """Whether a credential from `client` (for `key_id`, if an API key) may be checked."""
        waits = [self._auth_wait(keys=[client_auth_bucket(client)], args=[now, per_client])]
        if key_id is not None:  # a separate slot on a cluster: asked at the same time
            waits.append(self._auth_wait(keys=[key_auth_bucket(key_id)], args=[now, per_key]))
        client_wait, *key_wait = [float(_text(wait)) for wait in await asyncio.gather(*waits)]
        return auth_decision(client_wait, key_wait[0] if key_wait else 0.0)

    async def auth_failed(
        self, client: str, key_id: str | None, now: float, per_client: int, per_key: int
    ) -> None:
        """Charge one refused credential to its client and key id."""
        charges = [self._auth_charge(keys=[client_auth_bucket(client)], args=[now, per_client])]
        if key_id is not None:
            charges.append(self._auth_charge(keys=[key_auth_bucket(key_id)], args=[now, per_key]))
        await asyncio.gather(*charges)

    async def exchange_loads(
        self, model: str, replica: str, mine: str, now: float, stale_seconds: float
    ) -> list[str]:
        """Share this replica's loads of `model` (`""`: none) and read the other live ones'."""
        reply = await self._exchange_loads(
            keys=[fair_loads_key(model)], args=[now, stale_seconds, replica, mine]
        )
        return [_text(part) for part in reply]
