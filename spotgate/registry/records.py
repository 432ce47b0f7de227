"""What the registry stores and answers: agents, API keys, demand, and its errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from spotgate import __version__
from spotgate.admission import model_allowed

Lifecycle = Literal["spot", "on-demand", "local"]
EngineKind = Literal["vllm", "synthetic"]


class AgentState(StrEnum):
    """Life cycle of an agent: starting → ready → draining → gone."""

    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    GONE = "gone"


class RegistryError(Exception):
    """A registry operation was refused."""


class AgentNotFound(RegistryError):
    """No such agent is registered."""


class AgentGone(RegistryError):
    """The agent is `gone`; it can never come back under this id."""


class InvalidTransition(RegistryError):
    """The write would break the life cycle (e.g. `draining` → `ready`)."""


class ApiKeyRejected(RegistryError):
    """The API key is malformed, unknown or does not match (one error: no oracle)."""


class ApiKeyDisabled(RegistryError):
    """The API key is valid but disabled."""


class ApiKeyNotFound(RegistryError):
    """No key with this id exists."""


BootPhase = Literal[
    "instance_start", "agent_start", "weights_ready", "engine_loaded", "warmed_up", "ready"
]
BOOT_PHASES: tuple[BootPhase, ...] = (
    "instance_start", "agent_start", "weights_ready", "engine_loaded", "warmed_up", "ready"
)  # fmt: skip
"""An agent's boot in order: the instance launched, the agent's process (its image) started,
the weights were on hand (staged ones fetched), the engine loaded them, the warm-up generation
came back, the agent registered ready."""

BootKind = Literal["cold", "warm"]
"""A cold boot is an instance's first (a new volume: the image pulled, the weights fetched);
a warm one, an instance of the warm pool started again (its volume kept them)."""


@dataclass(frozen=True, slots=True)
class BootTimeline:
    """When each phase of an agent's boot ended: epoch seconds, 0 for a phase not seen."""

    instance_start: float = 0.0
    agent_start: float = 0.0
    weights_ready: float = 0.0
    engine_loaded: float = 0.0
    warmed_up: float = 0.0
    ready: float = 0.0

    def elapsed_seconds(self) -> dict[BootPhase, float]:
        """Seconds from the instance's start to the end of each phase seen (itself left out)."""
        start = self.instance_start or self.agent_start
        return {
            phase: max(0.0, at - start)
            for phase in BOOT_PHASES[1:]
            if (at := getattr(self, phase)) > 0 and start > 0
        }

    def as_dict(self) -> dict[str, float]:
        """The phases seen, by name (how the registry stores them)."""
        return {phase: at for phase in BOOT_PHASES if (at := getattr(self, phase)) > 0}


@dataclass(frozen=True, slots=True)
class AgentRecord:
    """One agent's registry item."""

    agent_id: str
    url: str
    model: str
    state: AgentState
    capacity: int
    active: int = 0
    heartbeat_at: float = 0.0
    # Heartbeats sent, and how many had been when the drain began: `active` counts the streams
    # of a draining agent only once a heartbeat came after (`active_since_drain`).
    heartbeats: int = 0
    heartbeats_at_drain: int = 0
    expires_at: float = 0.0
    drain_deadline: float | None = None
    rebalance_at: float | None = None
    lifecycle: Lifecycle = "local"
    instance_type: str = "local"
    region: str = "local"
    zone: str = "local"
    started_at: float = 0.0
    ready_at: float | None = None
    engine: EngineKind = "vllm"
    version: str = __version__
    # The model's context in tokens, and the most prompt characters one token stands for
    # (`spotgate.context`): the gateway refuses prompts they prove too long. 0: not published.
    max_model_len: int = 0
    max_token_chars: int = 0
    # When a write routing cares about last touched the entry (the writer's clock): the key
    # of the change feed gateways read (`BY_CHANGE_INDEX`).
    changed_at: float = 0.0
    boot: BootTimeline = field(default_factory=BootTimeline)
    # Whether this boot was the instance's first or a start from the warm pool: written by
    # the pool manager, which started it (`Registry.record_warm_boot`).
    boot_kind: BootKind = "cold"
    # Why the agent could not start (one line, for the operator); its entry is then `gone`.
    failure: str | None = None

    def is_live(self, now: float) -> bool:
        """Whether the entry has not expired (heartbeats keep pushing `expires_at`)."""
        return self.expires_at > now

    @property
    def shown_state(self) -> str:
        """The state as operators read it: `failed` for an agent that could not start."""
        return "failed" if self.failure is not None else self.state.value

    @property
    def active_since_drain(self) -> bool:
        """Whether `active` was reported after the drain began (not from an earlier heartbeat)."""
        return self.heartbeats > self.heartbeats_at_drain


@dataclass(frozen=True, slots=True)
class DrainOutcome:
    """Result of `set_draining`: `first` is False when another writer had drained it already."""

    first: bool
    record: AgentRecord


@dataclass(frozen=True, slots=True)
class ApiKeyRecord:
    """An API key's settings (never its secret or hash)."""

    key_id: str
    name: str
    rpm: int | None = None
    tpm: int | None = None
    max_tokens: int | None = None
    models: frozenset[str] = field(default_factory=frozenset)
    disabled: bool = False
    created_at: float = 0.0
    # Concurrent streams across every replica; None: the gateways' default for every key.
    max_streams: int | None = None
    # The tenant whose prefix cache the key shares (`spotgate.tenancy`); None: its own.
    tenant: str | None = None
    # Its tenant's share of a full model's queue against other tenants' (`gateway.fair_queue`).
    weight: float = 1.0

    def allows_model(self, model: str) -> bool:
        """Whether this key may use `model` (an empty set means every model)."""
        return model_allowed(self.models, model)


@dataclass(frozen=True, slots=True)
class CreatedApiKey:
    """A new key: `api_key` is the full text, shown to its owner once and never stored."""

    record: ApiKeyRecord
    api_key: str


@dataclass(frozen=True, slots=True)
class UsageCounts:
    """Tokens and streams: one stream's, or a sum."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    streams: int = 0
    # Of the tokens, those of flex streams (`service_tier: flex`, every request of a batch).
    flex_tokens: int = 0

    def __add__(self, other: UsageCounts) -> UsageCounts:
        return UsageCounts(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.streams + other.streams,
            self.flex_tokens + other.flex_tokens,
        )


@dataclass(frozen=True, slots=True)
class UsageRow:
    """An API key's usage of one model in one minute (`minute`: its start, epoch seconds)."""

    key_id: str
    model: str
    minute: int
    counts: UsageCounts


@dataclass(frozen=True, slots=True)
class BatchBacklog:
    """Batch work left for one model: its stream-seconds, and when the earliest is due."""

    stream_seconds: float
    due_at: float  # epoch seconds: the end of the batch's completion window


@dataclass(frozen=True, slots=True)
class Demand:
    """Interactive streams waiting and running for one model, and its batch work left.

    Summed over live gateways; flex streams are in neither `pending` nor `active`.
    """

    pending: int = 0
    active: int = 0
    backlog: BatchBacklog | None = None

    def plus(self, other: Demand) -> Demand:
        """Both gateways' demand: streams summed, backlogs summed, due at the earlier."""
        backlog = self.backlog or other.backlog
        if self.backlog is not None and other.backlog is not None:
            backlog = BatchBacklog(
                self.backlog.stream_seconds + other.backlog.stream_seconds,
                min(self.backlog.due_at, other.backlog.due_at),
            )
        return Demand(self.pending + other.pending, self.active + other.active, backlog)


@dataclass(frozen=True, slots=True)
class PoolForecast:
    """When the pool manager expects a model's next agent ready (it has one booting)."""

    ready_at: float  # epoch seconds: launch plus the cold start observed for its placement
    cold_start_seconds: float  # that observed cold start
