"""Fair turns across gateway replicas: who holds back a freed slot for another replica's tenant.

Each replica queues its own streams in fair turns (`gateway.fair_queue`), but agents are
shared, and a slot freed by one of a replica's streams goes to that replica's next waiter at
once; another replica hears of the room a refresh later. So a tenant whose thousand streams
land on one replica (one websocket carries them all) would keep every slot it holds while
other tenants wait on other replicas. Each replica therefore shares, through the limit store,
its interactive streams per model and tenant (open, waiting, weight) every
`FAIR_SHARE_EXCHANGE_SECONDS`, and before placing a new stream checks it against them all: a
tenant holds back while a tenant that runs fewer streams for its weight waits anywhere, and
the slot goes to whichever replica looks next (its next refresh: at most a second later).
Streams under way (moved) and flex streams never hold back. A replica that sees interactive
streams wait on another, and no room itself, stops one of its flex streams each exchange, as
a waiter of its own would (`waiting_elsewhere`). Pure: the exchange is the gateway's loop,
the numbers are the dispatcher's.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

FAIR_SHARE_EXCHANGE_SECONDS = 0.25
"""How often each replica shares its tenants' streams and reads the others'."""
FAIR_SHARE_HOLD_MAX_SECONDS = 2.0
"""The longest a waiting stream lets slots go to other replicas' turns before it takes one."""
FAIR_SHARE_STALE_SECONDS = 3.0
"""A replica that shared nothing for this long (it died) counts no more."""


class Waiting(Protocol):
    """A waiting stream as the dispatcher holds it."""

    @property
    def tenant(self) -> str:
        """Whose it is."""
        ...

    @property
    def flex(self) -> bool:
        """Whether it waits in the flex tier."""
        ...


class Holdable(Protocol):
    """A waiting stream that remembers when it was first held back."""

    held_since: float | None


@dataclass(frozen=True, slots=True)
class TenantLoad:
    """One tenant's interactive streams on a model: open (running or waiting), waiting."""

    streams: int
    waiting: int
    weight: float = 1.0

    @property
    def running(self) -> int:
        """Streams on agents."""
        return max(0, self.streams - self.waiting)

    def plus(self, other: TenantLoad) -> TenantLoad:
        """Both replicas' streams of the tenant."""
        weight = max(self.weight, other.weight)
        return TenantLoad(self.streams + other.streams, self.waiting + other.waiting, weight)


Loads = dict[str, TenantLoad]
"""A model's loads by tenant."""


def holds_back(
    tenant: str,
    loads: Mapping[str, TenantLoad],
    waiting: Mapping[str, TenantLoad] | None = None,
) -> bool:
    """Whether `tenant` lets a freed slot go to another tenant's turn.

    It does while another tenant waits (in `waiting`: on other replicas; by default in
    `loads`) that runs fewer streams for its weight, or as many and has fewer open (a lighter
    tenant: as a slot frees, the tenant that held it runs one fewer, and its turn would come
    again at once). Equal ones both try: the agent takes the first.
    """
    me = loads.get(tenant)
    if me is None:
        return False
    mine = _turn_key(me)
    waiting = loads if waiting is None else waiting
    return any(
        waiting[name].waiting > 0 and _turn_key(load) < mine
        for name, load in loads.items()
        if name != tenant and name in waiting
    )


def _turn_key(load: TenantLoad) -> tuple[float, float]:
    """Who goes first: fewer running streams for the weight, then fewer open."""
    return (load.running / load.weight, load.streams / load.weight)


def waiting_elsewhere(others: Mapping[str, Mapping[str, TenantLoad]]) -> list[str]:
    """The models for which interactive streams wait on other replicas."""
    return sorted(m for m, loads in others.items() if any(x.waiting for x in loads.values()))


def encode_loads(loads: Mapping[str, TenantLoad]) -> str:
    """A model's loads as the limit store keeps them."""
    return json.dumps({t: [load.streams, load.waiting, load.weight] for t, load in loads.items()})


def decode_loads(text: str) -> Loads:
    """Loads another replica shared (what is not a load is skipped)."""
    try:
        raw = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(raw, dict):
        return {}
    loads: Loads = {}
    for tenant, value in raw.items():
        if isinstance(value, list) and len(value) == 3 and _numbers(value):
            streams, waiting, weight = value
            if weight > 0:
                loads[str(tenant)] = TenantLoad(int(streams), int(waiting), float(weight))
    return loads


def _numbers(values: list[object]) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def summed(replicas: Iterable[Mapping[str, TenantLoad]]) -> Loads:
    """Several replicas' loads of one model, per tenant."""
    total: Loads = {}
    for loads in replicas:
        for tenant, load in loads.items():
            seen = total.get(tenant)
            total[tenant] = load if seen is None else seen.plus(load)
    return total


@dataclass(slots=True)
class FairShare:
    """The replica's interactive streams per model and tenant, and the other replicas'."""

    _streams: Counter[tuple[str, str]] = field(default_factory=Counter)
    others: dict[str, Loads] = field(default_factory=dict)  # model → tenant → load

    def opened(self, model: str, tenant: str) -> None:
        """An interactive stream of `tenant` for `model` was admitted here."""
        self._streams[model, tenant] += 1

    def closed(self, model: str, tenant: str) -> None:
        """It ended."""
        self._streams[model, tenant] -= 1
        if self._streams[model, tenant] <= 0:
            del self._streams[model, tenant]

    def local(
        self, waiting: Mapping[str, Iterable[Waiting]], weights: Mapping[str, float]
    ) -> dict[str, Loads]:
        """The replica's loads per model: its open streams, those waiting, their weights."""
        queued: Counter[tuple[str, str]] = Counter(
            (model, waiter.tenant)
            for model, waiters in waiting.items()
            for waiter in waiters
            if not waiter.flex
        )
        loads: dict[str, Loads] = {}
        for (model, tenant), streams in self._streams.items():
            weight = weights.get(tenant, 1.0)
            loads.setdefault(model, {})[tenant] = TenantLoad(streams, queued[model, tenant], weight)
        return loads

    def held(
        self,
        model: str,
        tenant: str,
        waiting: Mapping[str, Sequence[Waiting]],
        weights: Mapping[str, float],
        *,
        under_way: bool,
        flex: bool,
        waiter: Holdable | None,
        now: float,
    ) -> bool:
        """Whether a stream of `tenant` leaves a slot of `model` to one on another replica.

        A flex one leaves it to any interactive stream; a new one to a tenant running fewer
        (`holds_back`, against the tenants waiting elsewhere: those here take turns in the
        fair queue); one under way to none. A waiter held `FAIR_SHARE_HOLD_MAX_SECONDS` takes
        the slot anyway: replicas that each hold for the other's waiter never wait forever.
        """
        others = self.others.get(model)
        if not others or (under_way and not flex):  # alone: the fair queue decides
            return False
        if flex:
            held = any(load.waiting for load in others.values())
        else:
            mine = self.local({model: waiting.get(model, ())}, weights).get(model, {})
            held = holds_back(tenant, summed([mine, others]), others)
        if not held or waiter is None:
            return held
        if waiter.held_since is None:
            waiter.held_since = now
        return now - waiter.held_since < FAIR_SHARE_HOLD_MAX_SECONDS
