"""The gateway's view of the pool, and the per-model queue streams wait in for an agent.

The view is refreshed from the registry's change feed in the background (at most every second,
so a `draining` agent stops getting work within one), reading only what changed; if DynamoDB is
unreachable the gateway keeps routing on its last view and says so in `/readyz`. A stream that
finds no agent with room waits in a bounded per-model queue, hearing its position, until an
agent frees up or appears (scale-up, scale from zero) or its deadline passes; the queue takes
tenants in fair turns by tokens (gateway/fair_queue.py). While the pool manager has an agent of
the model booting, its forecast (its ready time, from the cold starts the pool has seen)
stretches the deadline to cover the boot; waiting streams hear the wait (`eta_seconds`).

The dispatcher also keeps the prefix index (gateway/prefix.py): every stream it places is
recorded against its agent, and agents that leave the view are forgotten. Prompts are hashed
within the stream's tenant (the frame's `tenant`, set from the client's key).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import suppress
from dataclasses import dataclass, field
from ipaddress import IPv4Network, IPv6Network

from gateway.fair_queue import (
    FairQueue,
    Queued,
    RunningFlex,
    Waiter,
    eta_seconds,
    place_in_line,
    wait_deadline,
)
from gateway.fair_share import FairShare, Loads
from gateway.prefix import PrefixIndex, PromptPrefix, prompt_prefix
from gateway.router import Candidate, PrefixAffinity, agent_url_allowed, choose_agent
from gateway.vouching import LaunchBook, RogueAgents, vouch
from spotgate.context import ContextLimits
from spotgate.logging import get_logger
from spotgate.protocol import GenerateFrame
from spotgate.registry import AgentRecord, AgentState, PoolForecast, Registry
from spotgate.settings import QueueSettings, RoutingSettings

STALE_AFTER_REFRESHES = 3
AGENT_FULL_SECONDS = 1.0
"""How long an agent that refused a stream for capacity gets no new one from this gateway
(unless one of this gateway's streams on it ends first): its other streams come from other
gateways, whose ends this one does not see."""
FEED_OVERLAP_SECONDS = 0.5
"""How far before the newest change it has seen a gateway reads the feed again: the feed's
index lags the table (typically well under a second) and writers' clocks differ a little."""
WHOLE_READ_SECONDS = 30.0
"""How often a gateway reads the whole feed anyway: it learns of deletions (TTL), and of a
change the overlap missed, within this."""
FORECAST_READ_SECONDS = 5.0
"""How often a gateway with streams waiting reads the pool manager's forecasts."""
ADAPTERS_REMEMBERED_PER_AGENT = 8
"""LoRA adapters remembered as sent to each agent: about as many as an agent keeps loaded."""

log = get_logger(__name__)


class UnknownModel(Exception):
    """No agent serves the model and it is not configured to scale from zero."""


class QueueFull(Exception):
    """Too many streams already wait for this model."""


class NoCapacity(Exception):
    """No agent had room before the stream's deadline."""


class GatewayClosing(Exception):
    """The gateway is stopping: streams waiting for an agent wait no more."""


@dataclass
class PoolView:
    """Agents per model as last read from the registry's change feed.

    The first read, and one every `WHOLE_READ_SECONDS`, takes the whole feed; the reads
    between take only entries changed since a little before the newest change seen.
    """

    agents: dict[str, list[AgentRecord]] = field(default_factory=dict)
    refreshed_at: float = 0.0
    last_error: str | None = None
    entries: dict[str, AgentRecord] = field(default_factory=dict)
    newest_change: float = 0.0
    whole_read_at: float | None = None

    def next_read_since(self, now: float) -> float | None:
        """Where the next read of the feed starts (None: the whole feed)."""
        if self.whole_read_at is None or now - self.whole_read_at >= WHOLE_READ_SECONDS:
            return None
        return self.newest_change - FEED_OVERLAP_SECONDS

    def replace(self, records: list[AgentRecord], now: float) -> None:
        """Install a read of the whole feed: entries it lacks were deleted (TTL)."""
        present = {record.agent_id for record in records}
        self.entries = {key: entry for key, entry in self.entries.items() if key in present}
        self.update(records, now)
        self.whole_read_at = now

    def update(self, changes: list[AgentRecord], now: float) -> None:
        """Install entries changed since the last read; a late copy of an older write loses."""
        for record in changes:
            known = self.entries.get(record.agent_id)
            if known is None or record.changed_at >= known.changed_at:
                self.entries[record.agent_id] = record
            self.newest_change = max(self.newest_change, record.changed_at)
        # Expired entries go (their agent stopped heartbeating); a `gone` one stays until it
        # expires, so a late copy of its last `ready` write cannot bring it back.
        self.entries = {key: e for key, e in self.entries.items() if e.expires_at > now}
        by_model: dict[str, list[AgentRecord]] = {}
        for record in self.entries.values():
            by_model.setdefault(record.model, []).append(record)
        self.agents = by_model
        self.refreshed_at = now
        self.last_error = None

    def ready_models(self) -> set[str]:
        """Models with at least one ready agent."""
        return {
            model
            for model, records in self.agents.items()
            if any(r.state is AgentState.READY for r in records)
        }

    def context_limits(self, model: str) -> ContextLimits | None:
        """The most any of the model's agents can hold (None while none has said)."""
        published = [
            ContextLimits(record.max_model_len, record.max_token_chars)
            for record in self.agents.get(model, [])
            if record.max_model_len > 0 and record.max_token_chars > 0
        ]
        if not published:
            return None
        return ContextLimits(
            max(limits.max_model_len for limits in published),
            max(limits.max_token_chars for limits in published),
        )

    def record(self, agent_id: str) -> AgentRecord | None:
        """The agent's last known entry."""
        for records in self.agents.values():
            for record in records:
                if record.agent_id == agent_id:
                    return record
        return None


class Dispatcher:
    """Chooses agents for streams and queues the streams that must wait."""

    def __init__(
        self,
        queue: QueueSettings,
        scale_from_zero_models: Collection[str] = (),
        clock: Callable[[], float] = time.time,
        agent_networks: Collection[IPv4Network | IPv6Network] = (),
        routing: RoutingSettings | None = None,
        rogues: RogueAgents | None = None,
        region: str | None = None,
    ) -> None:
        self.view = PoolView()
        self._region = region  # this gateway's: agents in another are remote
        self.launches = LaunchBook(clock)
        self.rogues = rogues or RogueAgents()
        self._routing = routing or RoutingSettings()
        self.prefixes = PrefixIndex(self._routing.prefix_blocks_per_agent)
        # The LoRA adapters each agent was sent lately, least lately first.
        self._adapters_sent: dict[str, OrderedDict[str, None]] = {}
        self._agent_networks = agent_networks
        self._refused_urls: set[str] = set()
        self.outstanding: Counter[str] = Counter()
        self._queue = queue
        self._scalable = frozenset(scale_from_zero_models)
        self._clock = clock
        self._waiting: dict[str, list[Waiter]] = {}
        self._fair: dict[tuple[str, bool], FairQueue] = {}  # per model and tier (flex)
        self.running_flex = RunningFlex()
        self.fair_share = FairShare()  # other replicas' tenants, for turns across replicas
        self._weights: dict[str, float] = {}  # each tenant's key's, as its last stream said
        self._changed = asyncio.Event()
        self._full_until: dict[str, float] = {}
        self.forecasts: dict[str, PoolForecast] = {}
        self._forecasts_read_at: float | None = None
        self.closing = False

    def pending(self) -> dict[str, int]:
        """Interactive streams waiting per model: the demand (flex ones add none)."""
        counts = {m: sum(not w.flex for w in waiters) for m, waiters in self._waiting.items()}
        return {model: count for model, count in counts.items() if count}

    def waiting(self, model: str) -> int:
        """Streams of any tier waiting for the model's agents."""
        return len(self._waiting.get(model, ()))

    def weigh(self, tenant: str, weight: float) -> None:
        """The tenant's share of a full queue against other tenants' from now on."""
        self._weights[tenant] = weight

    def notify(self) -> None:
        """Capacity may have changed: let waiting streams look again."""
        self._changed.set()
        self._changed = asyncio.Event()

    def close(self) -> None:
        """The gateway is stopping: waiting streams, and any placed from now on, give up."""
        self.closing = True
        self.notify()

    def prompt_prefix(self, frame: GenerateFrame) -> PromptPrefix | None:
        """What routing matches of the frame's prompt, within its tenant (None: routing is off)."""
        if not self._routing.prefix_aware:
            return None
        return prompt_prefix(
            frame,
            self._routing.prefix_block_chars,
            tenant=frame.tenant or "",
            shared_prompt_sha256=self._routing.shared_prompt_sha256,
        )

    def started(self, agent_id: str) -> None:
        """A stream went to `agent_id`."""
        self.outstanding[agent_id] += 1

    def taken(self, agent_id: str, prefix: PromptPrefix | None, adapter: str | None = None) -> None:
        """The agent took a stream with this prefix and adapter (it caches and loads them)."""
        if prefix is not None:
            self.prefixes.record(agent_id, prefix.blocks)
        if adapter is not None:
            sent = self._adapters_sent.setdefault(agent_id, OrderedDict())
            sent[adapter] = None
            sent.move_to_end(adapter)
            while len(sent) > ADAPTERS_REMEMBERED_PER_AGENT:
                sent.popitem(last=False)

    def finished(self, agent_id: str) -> None:
        """A stream on `agent_id` ended."""
        self.outstanding[agent_id] -= 1
        if self.outstanding[agent_id] <= 0:
            del self.outstanding[agent_id]
        self._full_until.pop(agent_id, None)  # that stream's place is free now
        self.notify()

    def refused_for_capacity(self, agent_id: str) -> None:
        """The agent is full of other gateways' streams: none of ours goes there for a while."""
        self._full_until[agent_id] = self._clock() + AGENT_FULL_SECONDS
        asyncio.get_running_loop().call_later(AGENT_FULL_SECONDS, self.notify)

    def _full(self, agent_id: str) -> bool:
        until = self._full_until.get(agent_id)
        if until is None:
            return False
        if until > self._clock():
            return True
        del self._full_until[agent_id]
        return False

    def candidates(self, model: str) -> list[Candidate]:
        """The model's agents with the gateway's own count of streams on them."""
        return [
            Candidate(
                agent_id=record.agent_id,
                state=record.state,
                capacity=record.capacity,
                outstanding=max(self.outstanding[record.agent_id], 0),
                expires_at=record.expires_at,
                reported=record.active,
                full=self._full(record.agent_id),
                adapters=frozenset(self._adapters_sent.get(record.agent_id, ())),
                remote=self._region is not None and record.region != self._region,
            )
            for record in self.view.agents.get(model, [])
        ]

    def choose(
        self,
        model: str,
        session: str | None,
        exclude: Collection[str],
        prefix: PromptPrefix | None = None,
        adapter: str | None = None,
    ) -> Candidate | None:
        """An agent with room now, if any (routing on the view's own time)."""
        candidates = self.candidates(model)
        affinity = None
        if prefix is not None:
            matched = {
                c.agent_id: self.prefixes.matched_blocks(c.agent_id, prefix.blocks)
                for c in candidates
            }
            affinity = PrefixAffinity(matched, prefix.conversation, self._routing.prefix_load_skew)
        return choose_agent(
            candidates,
            now=self.view.refreshed_at,
            session=session,
            exclude=exclude,
            affinity=affinity,
            adapter=adapter,
        )

    def _held(
        self, model: str, tenant: str, under_way: bool, flex: bool, me: Waiter | None = None
    ) -> bool:
        """Whether the stream leaves a slot to one waiting on another replica (flex: to any)."""
        waiting, weights, now = self._waiting, self._weights, self._clock()
        return self.fair_share.held(
            model, tenant, waiting, weights, under_way=under_way, flex=flex, waiter=me, now=now
        )

    def busy_models(self) -> set[str]:
        """Models with streams waiting here, or flex streams running: turns to take with others."""
        return {m for m, waiters in self._waiting.items() if waiters} | set(
            self.running_flex.counts()
        )

    def fair_loads(self) -> dict[str, Loads]:
        """The replica's interactive streams per model and tenant, to share with the others."""
        return self.fair_share.local(self._waiting, self._weights)

    def knows(self, model: str) -> bool:
        """Whether the model is served: an agent has it, or the pool can start one for it."""
        return model in self.view.agents or model in self._scalable

    async def acquire(
        self,
        model: str,
        *,
        session: str | None,
        exclude: Collection[str],
        deadline: float,
        prefix: PromptPrefix | None = None,
        adapter: str | None = None,
        under_way: bool = False,
        tenant: str = "",
        cost_tokens: int = 1,
        flex: bool = False,
    ) -> AsyncIterator[Queued | Candidate]:
        """Yield queue positions while waiting, then the chosen agent (last item).

        A stream `under_way` (moved, or resumed after a break) waits ahead of new ones and is
        never refused for a full queue: its client is mid-reply, and a spot loss, when the
        queue fills, must not cut it off. New ones wait in their tenants' fair turns; `flex`
        ones behind them all, taking an agent only when no other stream waits.
        """
        if self.closing:
            raise GatewayClosing(model)
        waiters = self._waiting.setdefault(model, [])
        chosen = None if flex and waiters else self.choose(model, session, exclude, prefix, adapter)
        if chosen is not None and not self._held(model, tenant, under_way, flex):
            yield chosen
            return
        if not self.knows(model):
            raise UnknownModel(model)
        # Each tier has the whole queue's room: flex streams never crowd interactive ones out.
        if (
            not under_way
            and sum(w.flex == flex for w in waiters) >= self._queue.max_pending_per_model
        ):
            raise QueueFull(model)
        fair = self._fair.setdefault((model, flex), FairQueue())
        tag = 0.0 if under_way else fair.tag(tenant, cost_tokens, self._weights.get(tenant, 1))
        me = Waiter(under_way, tag, flex, tenant)
        waiters.insert(place_in_line(waiters, me), me)
        if not flex:  # its place is a flex stream's, which waits again behind it
            self.running_flex.preempt_one(model)
        queued_at = self._clock()
        until = deadline
        try:
            heard: tuple[int, PoolForecast | None] | None = None
            while True:
                # Taken before the yield: a change while the caller holds the queued event
                # (a refresh, an agent freed, the gateway closing) wakes this wait at once.
                changed = self._changed
                if self.closing:
                    raise GatewayClosing(model)
                position, forecast = waiters.index(me), self.forecasts.get(model)
                if (position, forecast) != heard:  # a new place in line, or a new forecast
                    heard = (position, forecast)
                    yield Queued(position, eta_seconds(forecast, self._clock()))
                if position == 0:  # an agent that came just as the wait ran out still serves
                    chosen = self.choose(model, session, exclude, prefix, adapter)
                    if chosen is not None and not self._held(model, tenant, under_way, flex, me):
                        break
                # Never shortened: the forecast goes as its agent turns ready, which this
                # gateway's view may show a moment later.
                until = max(
                    until,
                    wait_deadline(
                        deadline, forecast, queued_at, self._queue.cold_start_wait_max_seconds
                    ),
                )
                remaining = until - self._clock()
                if remaining <= 0:
                    raise NoCapacity(model)
                with suppress(TimeoutError):  # the wait ran out: look again
                    async with asyncio.timeout(remaining):
                        await changed.wait()
        finally:
            waiters.remove(me)
            self.notify()
        if not under_way:
            fair.served(me.tag)
        yield chosen

    async def refresh_forever(self, registry: Registry, interval_seconds: float) -> None:
        """Keep the view current; on registry errors keep the last view and record why."""
        while True:
            await self.refresh(registry)
            await asyncio.sleep(interval_seconds)

    async def refresh(self, registry: Registry) -> None:
        """Read the registry's change feed once into the view (an outage keeps the last one).

        While streams wait, the pool manager's forecasts for their models are read too (every
        few seconds); failing that, they wait on the last ones read.
        """
        try:
            await self._read_forecasts(registry)
        except Exception as err:  # a forecast only stretches waits: never stop routing for it
            log.warning("pool forecasts unreadable; keeping the last", error=type(err).__name__)
        try:
            since = self.view.next_read_since(self._clock())
            read = await registry.changed_since(since)
            changes = await self._vouched(
                registry, [record for record in read if self._may_connect(record)]
            )
            if since is None:
                present = [record.agent_id for record in read]
                self.launches.retain(present)
                self.rogues.retain(present)
                self.view.replace(changes, self._clock())
            else:
                self.view.update(changes, self._clock())
            live = [
                key
                for key, entry in self.view.entries.items()
                if entry.state is not AgentState.GONE
            ]
            self.prefixes.retain(live)
            self._adapters_sent = {
                agent: sent for agent, sent in self._adapters_sent.items() if agent in live
            }
            self.notify()
        except Exception as err:  # an outage must not stop routing on the last view
            if self.view.last_error is None:
                log.warning("registry unreachable; routing on the last view", error=str(err))
            # The class only: `/readyz` shows it, and the message names accounts and hosts.
            self.view.last_error = type(err).__name__

    async def _read_forecasts(self, registry: Registry) -> None:
        now = self._clock()
        if not self.pending():
            self.forecasts, self._forecasts_read_at = {}, None  # read afresh when one queues
            return
        if self._forecasts_read_at is not None and (
            now - self._forecasts_read_at < FORECAST_READ_SECONDS
        ):
            return
        self._forecasts_read_at = now  # a failed read waits its turn too
        self.forecasts = await registry.read_forecasts(self.pending())

    async def _vouched(self, registry: Registry, records: list[AgentRecord]) -> list[AgentRecord]:
        """The rows the pool manager vouches for, capped to what it vouches (`vouch`)."""
        checked = [r.agent_id for r in records if r.state is not AgentState.GONE]
        launches = await self.launches.launches(registry, checked)
        kept = []
        for record in records:
            vouched = vouch(record, launches.get(record.agent_id))
            for reason in vouched.findings:
                self.rogues.row_refused(record.agent_id, reason, record)
            if vouched.record is not None:
                kept.append(vouched.record)
        return kept

    def _may_connect(self, record: AgentRecord) -> bool:
        if agent_url_allowed(record.url, self._agent_networks):
            return True
        if record.url not in self._refused_urls:  # once: the entry comes back every heartbeat
            self._refused_urls.add(record.url)
            log.warning(
                "agent entry ignored: its URL is outside agent_networks",
                agent_id=record.agent_id,
                url=record.url,
            )
        return False

    def view_is_stale(self, interval_seconds: float) -> bool:
        """Whether the last successful refresh is several intervals old."""
        age = self._clock() - self.view.refreshed_at
        return age > STALE_AFTER_REFRESHES * max(interval_seconds, 1.0)
