"""The pool manager's settings (`SPOTGATE_POOL_…`).

Written once: the policy, the simulator and `spotgate sim` take their defaults from them
(`POOL_DEFAULTS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal, Self

from pydantic import (
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from spotgate.regions import unknown_regions, zone_region
from spotgate.settings.agent import ModelServing
from spotgate.settings.shared import (
    EngineKind,
    NonNegativeInt,
    ServedName,
    SettingsSection,
    SharedSettings,
)

DEFAULT_AGENT_CAPACITY = 256
"""Streams the pool manager vouches one agent serves, unless its placement says otherwise."""


class Placement(SettingsSection):
    """One (instance type, zone) the pool may launch into, with its hourly prices."""

    instance_type: str
    zone: str
    spot_price_per_hour: PositiveFloat
    on_demand_price_per_hour: PositiveFloat
    # The most streams one agent on this instance type serves: its launch record says so,
    # and gateways cap what the agent's own row claims at it.
    capacity: PositiveInt = DEFAULT_AGENT_CAPACITY


LOCAL_INSTANCE_TYPE = "local"
"""The local provider's one instance type: an agent subprocess on this machine."""
LOCAL_ZONE_LETTERS = ("a", "b")


def local_placements(regions: Sequence[str]) -> tuple[Placement, ...]:
    """Two zones of each region for the local provider, whose agents say they run there."""
    return tuple(
        Placement(
            instance_type=LOCAL_INSTANCE_TYPE,
            zone=f"{region}{letter}",
            spot_price_per_hour=1.0,
            on_demand_price_per_hour=3.0,
        )
        for region in regions
        for letter in LOCAL_ZONE_LETTERS
    )


class Ec2PoolSettings(SettingsSection):
    """How the `ec2` provider launches agents."""

    pool_name: str = "spotgate"  # the `spotgate:pool` tag on every instance of this pool
    launch_template: str = "spotgate-agent"  # name (or `lt-…` id) of the agents' template
    subnets: dict[str, str] = Field(default_factory=dict)  # zone → subnet id (private)


class LocalPoolSettings(SettingsSection):
    """How the `local` provider runs agents: subprocesses of the pool manager on this machine."""

    engine: EngineKind = "synthetic"
    jwks_url: str | None = None  # the gateway's JWKS, for the agents' token checks
    drain_grace_seconds: PositiveFloat = 20.0
    log_dir: str = ".spotgate/logs"
    agent_env: dict[str, str] = Field(default_factory=dict)  # more SPOTGATE_AGENT_… settings


class PoolModel(SettingsSection):
    """One model the pool serves, with its own bounds and capacity (a plain name: the defaults).

    Each model is sized and placed on its own: demand for one never launches another. What the
    agents run (weights, revision, tensor-parallel size, engine arguments, parsers) is the
    model's launch configuration: on EC2 its own launch template (the CDK app writes one per
    model), locally `source` and `agent_env`.
    """

    name: Annotated[ServedName, Field(min_length=1)]  # what clients ask for: `spotgate:model`
    min_agents: NonNegativeInt | None = None  # None: the pool's min_agents
    max_agents: PositiveInt | None = None  # None: the pool's max_agents
    # Demand gone for this long scales the model down (to min_agents; 0 of them: to zero).
    scale_to_zero_idle_seconds: PositiveFloat | None = None  # None: the pool's
    # Stopped on-demand instances kept to start in a warm start (EC2 stop/start); None: the pool's
    warm_pool_size: NonNegativeInt | None = None
    # GiB of a stopped instance's volume, which its warm pool costs; None: the pool's volume_gib
    volume_gib: PositiveFloat | None = None
    instance_types: tuple[str, ...] = ()  # of the pool's placements; empty: all of them
    launch_template: str | None = None  # ec2: this model's template; None: ec2.launch_template
    source: str = ""  # local: the agents' SPOTGATE_AGENT_MODEL (a directory); empty: none
    # local: its parsers, chat template and engine arguments (on EC2 its launch template's)
    serving: ModelServing = ModelServing()
    agent_env: dict[str, str] = Field(default_factory=dict)  # local: its agents' settings

    @model_validator(mode="after")
    def _bounds_ordered(self) -> Self:
        if self.max_agents is not None and self.max_agents < (self.min_agents or 0):
            raise ValueError(
                f"model {self.name}: max_agents ({self.max_agents}) must be at least "
                f"min_agents ({self.min_agents})"
            )
        return self


class PoolSettings(BaseSettings):
    """The pool manager (`SPOTGATE_POOL_…`)."""

    model_config = SettingsConfigDict(
        env_prefix="SPOTGATE_POOL_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    shared: SharedSettings = Field(default_factory=SharedSettings)
    provider: Literal["ec2", "local"] = "local"
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8090  # /healthz and /metrics; 0: none
    # The models the pool serves (min_agents applies to each even with no demand yet); demand
    # for a model not named here launches nothing. A plain name takes the pool's settings.
    models: tuple[PoolModel, ...] = ()
    min_agents: NonNegativeInt = 0
    max_agents: PositiveInt = 4
    target_streams_per_agent: PositiveInt = 32
    spot_overprovision: NonNegativeInt = 1
    # Spot agents a model may run beyond its interactive target for batch work that would
    # otherwise miss its completion window (never on-demand; 0: batches use spare capacity only).
    batch_spot_max_agents: NonNegativeInt = 4
    on_demand_fallback: bool = True
    on_demand_hold_seconds: NonNegativeFloat = 1800.0
    scale_to_zero_idle_seconds: PositiveFloat = 600.0
    # Per model: stopped on-demand instances that booted once, started first for on-demand
    # cover or a scale from zero (their volume keeps the image and weights).
    warm_pool_size: NonNegativeInt = 0
    # Cover spot's margin on-demand too while spot has nowhere to place it and its loss is
    # likely: the newest ready spot agent came up within the age, and, where on-demand already
    # carries more than the margin, that cover has run for the shortage time (the policy's
    # `margin_cover`).
    on_demand_margin: bool = False
    on_demand_margin_spot_age_seconds: PositiveFloat = 28800.0
    on_demand_margin_shortage_seconds: NonNegativeFloat = 1800.0
    # What a stopped instance still costs: its volume (GiB: the launch template's root
    # volume), at EBS gp3's price in us-east-1, $0.08 per GB-month.
    volume_gib: PositiveFloat = 200.0
    volume_price_per_gib_month: NonNegativeFloat = 0.08
    launch_timeout_seconds: PositiveFloat = 900.0
    warm_start_timeout_seconds: PositiveFloat = 600.0  # a start from the warm pool to ready
    # Launch to ready, assumed until the pool has timed a cold start of its own.
    cold_start_seconds: PositiveFloat = 600.0
    risky_placement_seconds: PositiveFloat = 1800.0
    loop_seconds: PositiveFloat = 5.0
    interruption_queue_url: str | None = None
    # SQS long polling, capped by loop_seconds; 0 on an emulator that serves one call at a time
    event_wait_seconds: Annotated[int, Field(ge=0, le=20)] = 20
    placements: tuple[Placement, ...] = ()
    # The regions the pool places in, each with an EC2 provider of its own; empty: those of the
    # placements' zones (none: the shared region). Gateways and the registry stay in the
    # shared (home) region.
    regions: tuple[str, ...] = ()
    ec2: Ec2PoolSettings = Field(default_factory=Ec2PoolSettings)
    local: LocalPoolSettings = Field(default_factory=LocalPoolSettings)

    @field_validator("models", mode="before")
    @classmethod
    def _names_are_models(cls, models: Any) -> Any:
        if isinstance(models, (list, tuple)):
            return tuple({"name": m} if isinstance(m, str) else m for m in models)
        return models

    @model_validator(mode="after")
    def _zones_in_regions(self) -> Self:
        if unknown := unknown_regions(self.regions):
            raise ValueError(f"regions: no EC2 region is called {', '.join(unknown)}")
        if len(set(self.regions)) != len(self.regions):
            raise ValueError(f"regions: each region once ({', '.join(self.regions)})")
        zones = [p.zone for p in self.placements] + list(self.ec2.subnets)
        for zone in zones:
            region = zone_region(zone)
            if self.regions and region not in self.regions:
                raise ValueError(
                    f"zone {zone} is in {region}, not in the pool's regions "
                    f"({', '.join(self.regions)})"
                )
        return self

    @property
    def pool_regions(self) -> tuple[str, ...]:
        """The regions the pool places in: those listed, else its placements' (else home)."""
        if self.regions:
            return self.regions
        placed = sorted({zone_region(placement.zone) for placement in self.placements})
        return tuple(placed) or (self.shared.aws.region,)

    @model_validator(mode="after")
    def _bounds_ordered(self) -> Self:
        if self.max_agents < self.min_agents:
            raise ValueError(
                f"max_agents ({self.max_agents}) must be at least min_agents ({self.min_agents})"
            )
        names = [model.name for model in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"models: each name once ({', '.join(names)})")
        known = {placement.instance_type for placement in self.placements}
        for model in self.models:
            if self.provider == "ec2" and model.serving.model_fields_set:
                raise ValueError(
                    f"model {model.name}: serving is its launch template's on EC2 (the CDK's "
                    "models[].toolCallParser, reasoningParser, chatTemplate, engineArgs)"
                )
            unknown = set(model.instance_types) - known if self.placements else set()
            if unknown:
                raise ValueError(
                    f"model {model.name}: instance types {sorted(unknown)} are in no placement"
                )
        return self

    def model(self, name: str) -> PoolModel | None:
        """The settings of the model called `name`, if the pool serves it."""
        return next((model for model in self.models if model.name == name), None)


POOL_DEFAULTS = PoolSettings.model_construct(shared=SharedSettings.model_construct())
"""The pool's settings as they stand with nothing set (the environment is not read: a bad
`SPOTGATE_…` value is reported by the command that reads it, not by an import): where
the policy's, the simulator's and `spotgate sim`'s defaults come from, so each is written
once, here."""
