"""Settings for every spotgate service, read from the environment (ARCHITECTURE.md).

Prefixes: ``SPOTGATE_`` for what all services share, ``SPOTGATE_GATEWAY_``,
``SPOTGATE_AGENT_`` and ``SPOTGATE_POOL_`` for each service; nested fields use ``__``
(``SPOTGATE_AWS__ENDPOINT_URL``, ``SPOTGATE_GATEWAY_LIMITS__MAX_FRAME_BYTES``).
Every value is validated at start-up so a bad deployment fails with one clear line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    IPvAnyNetwork,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

TOKEN_TTL_MAX_SECONDS = 15 * 60
"""ARCHITECTURE.md: a token lives at most 15 minutes."""

DEFAULT_MAX_FRAME_BYTES = 64 * 1024
"""ARCHITECTURE.md: client frames are capped at 64 KiB unless configured otherwise."""

MAX_REQUEST_BYTES = 4 * 1024 * 1024
"""The largest request a service reads: an HTTP body, or a websocket frame at most."""

LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["auto", "json", "console"]
Lifecycle = Literal["spot", "on-demand", "local"]
EngineKind = Literal["vllm", "synthetic"]
NonNegativeInt = Annotated[int, Field(ge=0)]
ADAPTER_SEPARATOR = ":"
"""`<model>:<adapter>` names a LoRA adapter of a served model, so no served name holds it."""


def _served_name(name: str) -> str:
    if ADAPTER_SEPARATOR in name:
        raise ValueError(
            f"{name!r}: a served model's name has no '{ADAPTER_SEPARATOR}' "
            f"('<model>{ADAPTER_SEPARATOR}<adapter>' names a LoRA adapter of a model)"
        )
    return name


ServedName = Annotated[str, AfterValidator(_served_name)]


class _Section(BaseModel):
    """A nested group of settings: unknown fields are an error, not silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class AwsSettings(_Section):
    """Where the AWS APIs are: the real ones, or the emulator in local mode and tests."""

    region: str = "us-east-1"
    endpoint_url: str | None = None
    # Unset in production: boto's default chain (instance role, task role) is used.
    access_key_id: str | None = None
    secret_access_key: SecretStr | None = None


DEFAULT_AGENT_CAPACITY = 256
"""Streams the pool manager vouches one agent serves, unless its placement says otherwise."""


class TableNames(_Section):
    """DynamoDB table names (ARCHITECTURE.md)."""

    agents: str = "spotgate-agents"
    keys: str = "spotgate-keys"
    demand: str = "spotgate-demand"
    usage: str = "spotgate-usage"
    launches: str = "spotgate-launches"


class RegistryTimings(_Section):
    """How long registry entries live without being refreshed."""

    agent_ttl_seconds: PositiveFloat = 30.0
    demand_ttl_seconds: PositiveFloat = 30.0
    gone_ttl_seconds: PositiveFloat = 3600.0
    # Per-minute usage rows of API keys: kept 400 days, then removed by TTL.
    usage_ttl_seconds: PositiveFloat = 400 * 24 * 3600.0


class SharedSettings(BaseSettings):
    """What every service shares: AWS endpoint, table names, logging."""

    model_config = SettingsConfigDict(
        env_prefix="SPOTGATE_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    aws: AwsSettings = AwsSettings()
    tables: TableNames = TableNames()
    registry: RegistryTimings = RegistryTimings()
    log_level: LogLevel = "info"
    log_format: LogFormat = "auto"


class SocketLimits(_Section):
    """Limits on every websocket (ARCHITECTURE.md); each breach is a clear `error` frame."""

    # A client's frame; at most MAX_REQUEST_BYTES, so a gateway's link to an agent, sized
    # from it, carries every frame a legal request can make (`spotgate.protocol`).
    max_frame_bytes: Annotated[int, Field(gt=0, le=MAX_REQUEST_BYTES)] = DEFAULT_MAX_FRAME_BYTES
    heartbeat_seconds: PositiveFloat = 20.0
    idle_timeout_seconds: PositiveFloat = 300.0
    auth_timeout_seconds: PositiveFloat = 5.0
    max_streams_per_connection: PositiveInt = 16
    max_prompt_chars: PositiveInt = 200_000


class TokenSettings(_Section):
    """Token signing: lifetime, clock leeway, and where the Ed25519 private key comes from."""

    ttl_seconds: Annotated[int, Field(ge=1, le=TOKEN_TTL_MAX_SECONDS)] = 60
    leeway_seconds: Annotated[float, Field(ge=0, le=60)] = 5.0
    signing_key_file: Path | None = None
    signing_key_pem: SecretStr | None = None
    signing_key_secret_id: str | None = None

    @model_validator(mode="after")
    def _one_key_source(self) -> Self:
        sources = [self.signing_key_file, self.signing_key_pem, self.signing_key_secret_id]
        if sum(source is not None for source in sources) > 1:
            raise ValueError(
                "set only one of signing_key_file, signing_key_pem, signing_key_secret_id"
            )
        return self


class QueueSettings(_Section):
    """The per-model wait queue used while the pool scales (issue: serverless queueing)."""

    max_pending_per_model: PositiveInt = 256
    deadline_seconds: PositiveFloat = 120.0
    # While the pool boots an agent for the model, a queued stream waits past its deadline
    # until that agent is expected ready (the pool manager's observed cold start, plus a
    # grace), but never longer than this from when it queued: a scale from zero on GPU
    # instances takes minutes.
    cold_start_wait_max_seconds: PositiveFloat = 900.0
    # How long an agent's stream may send nothing (before its first token, or between two)
    # before the gateway moves it to another agent: an engine that stopped producing while its
    # agent still answers (a wedged GPU) must not hold a client. Well above the slowest
    # legitimate gap: a long prompt's prefill on a busy agent.
    stall_seconds: PositiveFloat = 30.0
    # On a drain (a spot notice, a scale-down), move a stream that cannot finish in time
    # before its agent breaks it: its next agent prefills while it streams on, and the client
    # sees no gap. Off: it moves when its agent ends it, and waits for the next agent to
    # prefill the whole conversation.
    move_before_break: bool = True


class RoutingSettings(_Section):
    """How the gateway picks an agent for a stream that names no session (gateway/router.py)."""

    # Route on the prompt's prefix (chat messages in order, hashed in blocks): a turn goes
    # where its history was sent before, so vLLM's prefix cache holds it. Off: least load.
    prefix_aware: bool = True
    # Characters per hashed block (about 64 tokens): a prompt's partial last block is not
    # matched, as vLLM caches only whole blocks.
    prefix_block_chars: Annotated[int, Field(ge=16, le=65_536)] = 256
    # Blocks remembered per agent, oldest forgotten first: about what an agent's KV cache
    # holds (16,384 blocks of 64 tokens, a million tokens), about 2 MB of memory per agent.
    prefix_blocks_per_agent: Annotated[int, Field(ge=1, le=1_048_576)] = 16_384
    # How much busier (as a share of capacity) than the least loaded agent with room an agent
    # may be and still be chosen for its cached prefix: beyond it, a hot prefix spills.
    prefix_load_skew: Annotated[float, Field(ge=0, le=1)] = 0.25
    # System prompts every tenant's chats may match on (`spotgate.tenancy`), as the SHA-256 of
    # their text in hex; any other prompt matches only its own tenant's.
    shared_prompt_sha256: tuple[Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")], ...] = ()


class LimitStoreSettings(_Section):
    """Where every gateway replica keeps per-key limits and failed-auth budgets (Redis, Valkey).

    Unset, each replica keeps its own, and a key's limits multiply with the replicas.
    """

    # `redis://host:port/0`, or `rediss://` for TLS (ElastiCache Serverless); a password in
    # the URL stays out of logs.
    url: SecretStr | None = None
    # A cluster-mode endpoint (ElastiCache Serverless is one).
    cluster: bool = False
    # A call that has not answered by then counts as the store being unreachable.
    timeout_seconds: Annotated[float, Field(gt=0, le=5.0)] = 0.25
    # While unreachable, each replica uses its own buckets; it checks the store this often.
    retry_seconds: PositiveFloat = 2.0


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


class GatewaySettings(BaseSettings):
    """The edge gateway (`SPOTGATE_GATEWAY_…`)."""

    model_config = SettingsConfigDict(
        env_prefix="SPOTGATE_GATEWAY_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    shared: SharedSettings = Field(default_factory=SharedSettings)
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8080
    # A listening socket the parent bound and handed down (socket activation): the gateway
    # serves on it, and `port` names its port.
    listen_fd: NonNegativeInt | None = None
    # `/metrics`, `/readyz` and `/healthz` are served on a listener of their own, on `host`:
    # the load balancer forwards only `port`, so no path on it reaches them. 0: any free port.
    ops_port: Annotated[int, Field(ge=0, le=65535)] = 9090
    # As `listen_fd`, for `ops_port`.
    ops_listen_fd: NonNegativeInt | None = None
    # Where clients reach this gateway (behind a load balancer, its URL: every replica's);
    # unset, this replica's own `http://host:port`, which `ws_url` then names.
    public_url: str | None = None
    # The `iss` of the tokens the gateway issues and accepts: one for every replica, so each
    # accepts the others' tokens and agents trust them all. Unset: the public URL.
    token_issuer: str | None = None
    gateway_id: str | None = None
    token: TokenSettings = TokenSettings()
    # An SSM parameter the gateway puts its JWKS in at start, for agents to read with their
    # IAM role rather than through the load balancer (the CDK app sets it).
    jwks_parameter: str | None = None
    limits: SocketLimits = SocketLimits()
    queue: QueueSettings = QueueSettings()
    routing: RoutingSettings = RoutingSettings()
    # Browsers (an `Origin` header) may open /v1/ws from the gateway's own origin (its public
    # URL, or the host they asked for) and from these, e.g. `https://chat.example`.
    allowed_origins: tuple[str, ...] = ()
    # Where agents may be (CIDRs, e.g. the VPC's): an agent entry whose URL is not an address
    # inside one is never connected to, so a forged registry row cannot draw the gateway's
    # tokens elsewhere. Empty: anywhere (local mode; the CDK app sets the VPC's range).
    agent_networks: tuple[IPvAnyNetwork, ...] = ()
    # Proxies in front of the gateway that append to `X-Forwarded-For` (1 behind an ALB): the
    # client address that failed authentications are counted by is the entry they added.
    trusted_proxy_hops: NonNegativeInt = 0
    failed_auth_per_client_per_minute: PositiveInt = 20
    failed_auth_per_key_per_minute: PositiveInt = 60
    # A request body not received in full within this long is answered 408 (slow senders).
    http_body_timeout_seconds: PositiveFloat = 30.0
    compress: bool = False
    # How often the pool view reads the registry's change feed (what changed, not the whole
    # table): at most 1 s, so a `draining` agent gets no new stream a second after the change.
    registry_refresh_seconds: Annotated[float, Field(gt=0, le=1.0)] = 0.5
    demand_publish_seconds: PositiveFloat = 2.0
    agent_connection_limit: PositiveInt = 1024
    max_streams_per_key: PositiveInt = 64
    limit_store: LimitStoreSettings = LimitStoreSettings()
    # On SIGTERM streams in flight get this long to finish before sockets close (GOING_AWAY);
    # a load balancer's deregistration delay should match it.
    shutdown_grace_seconds: Annotated[float, Field(ge=0)] = 30.0
    # Idle HTTP keep-alive; behind a load balancer, set it above the balancer's idle timeout
    # so the balancer, not the gateway, closes idle connections (else: occasional 502s). A new
    # connection that has not sent its request headers by then is closed too (slow senders).
    keepalive_seconds: PositiveFloat = 75.0
    models: tuple[ServedName, ...] = ()
    # Local mode only (`spotgate up` sets it): the chat page offers this key so it works at
    # once. Anyone who can load the page can read it, so it needs a loopback `host`.
    chat_dev_api_key: SecretStr | None = None

    @model_validator(mode="after")
    def _ops_port_of_its_own(self) -> Self:
        if self.ops_port != 0 and self.ops_port == self.port:
            raise ValueError(
                f"ops_port {self.ops_port} is the traffic port too: operations need a port the "
                "load balancer does not forward"
            )
        return self

    @model_validator(mode="after")
    def _dev_key_on_loopback_only(self) -> Self:
        if self.chat_dev_api_key is not None and self.host not in LOOPBACK_HOSTS:
            raise ValueError(
                f"chat_dev_api_key is for a gateway on loopback only, not host {self.host!r}: "
                "anyone who can reach the chat page can read it"
            )
        return self


class VllmSettings(_Section):
    """Engine arguments handed to vLLM's `AsyncLLM`."""

    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = "auto"
    max_model_len: PositiveInt | None = None
    max_num_seqs: PositiveInt = 64
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.9
    tensor_parallel_size: PositiveInt = 1
    enforce_eager: bool = False
    # vLLM's `--tool-call-parser` for this model (`hermes` for Qwen2.5/Qwen3 and Hermes, …):
    # how the calls a model makes of its own accord (`tool_choice: auto`) are read from its
    # text. None: such requests are refused with a 400 naming `tool_choice`.
    tool_call_parser: str | None = None
    # vLLM's `--reasoning-parser` for this model (`qwen3`, `deepseek_r1`, …): how the model's
    # thinking is told from its answer, streamed as `reasoning_content`. None: no reasoning
    # output (a request asking for reasoning settings is refused naming them).
    reasoning_parser: str | None = None
    # The model's revision on the Hugging Face Hub (a commit hash pins it): weights, tokenizer
    # and chat template of exactly that commit. None: the newest of the default branch.
    revision: str | None = None
    # LoRA adapters a request may name (`model: "<served name>:<adapter>"`): each a directory,
    # or `s3://bucket/prefix` staged with `spotgate model stage` (fetched into
    # `model_cache_dir` on first use). Loaded on demand, at most `max_loras` at once, each of
    # rank `max_lora_rank` at most.
    lora_adapters: dict[str, str] = Field(default_factory=dict)
    max_loras: PositiveInt = 4
    max_lora_rank: PositiveInt = 16
    # Every other engine argument of vLLM's, as `vllm serve` takes it (`--quantization awq
    # --kv-cache-dtype fp8 --max-num-batched-tokens 8192`): read by vLLM's own parser when the
    # engine starts; one it does not know, or of the wrong type, stops the start naming it.
    # The arguments above are set by their own settings, not here (gpu_agent/engine_args.py).
    engine_args: str = ""


class SyntheticSettings(_Section):
    """The synthetic engine: fixed time to first token and decode rate."""

    ttft_seconds: Annotated[float, Field(ge=0)] = 0.05
    tokens_per_second: PositiveFloat = 50.0
    capacity: PositiveInt = 256
    # Its prompts are one token per UTF-8 byte; this is the context it says it has (a reply
    # asked for without max_tokens fills it: the synthetic engine never ends one by itself).
    max_model_len: PositiveInt = 32_768
    # Reply to a chat with its last user message, a byte per token (UI tests: exact text).
    echo: bool = False
    # Tell `<think>…</think>` in its replies from the answer, as a reasoning model's agent does
    # (UI tests of reasoning, with `echo`).
    reasoning: bool = False
    # How long it takes to come up, standing in for a model's load (cold-start tests).
    load_seconds: Annotated[float, Field(ge=0)] = 0.0


class AgentSettings(BaseSettings):
    """The GPU agent (`SPOTGATE_AGENT_…`)."""

    model_config = SettingsConfigDict(
        env_prefix="SPOTGATE_AGENT_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    shared: SharedSettings = Field(default_factory=SharedSettings)
    agent_id: str | None = None
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8000
    # As the gateway's: a socket bound by the parent, on `port`.
    listen_fd: NonNegativeInt | None = None
    advertise_url: str | None = None
    engine: EngineKind = "vllm"
    # A directory, a Hugging Face id, or `s3://bucket/prefix`: a model staged with
    # `spotgate model stage`, fetched into `model_cache_dir` (instance storage on a GPU
    # instance) before the engine loads it.
    model: str = ""
    model_cache_dir: str = "~/.cache/spotgate/models"
    # How a staged model's weights reach the engine: `download` (many ranged GETs to
    # `model_cache_dir`, each file checked against the manifest, then loaded from disk) or
    # `stream` (vLLM's Run:ai streamer reads them from S3 straight into the engine; the
    # `gpu` extra installs it).
    model_fetch: Literal["download", "stream"] = "download"
    served_model_name: ServedName | None = None
    vllm: VllmSettings = VllmSettings()
    synthetic: SyntheticSettings = SyntheticSettings()
    limits: SocketLimits = SocketLimits()
    # Where the gateway's public keys are: an SSM parameter the gateways publish to (read
    # with the instance role: what the CDK app sets), or the gateway's JWKS URL.
    jwks_parameter: str | None = None
    jwks_url: str | None = None
    pinned_public_key: str | None = None
    token_issuer: str | None = None
    token_leeway_seconds: Annotated[float, Field(ge=0, le=60)] = 5.0
    imds_url: str = "http://169.254.169.254"
    imds_poll_seconds: PositiveFloat = 5.0
    heartbeat_seconds: PositiveFloat = 5.0
    # How often the agent checks its engine still produces (tokens of running streams, else a
    # one-token probe), and how long without a token counts as wedged: the agent then hands
    # its streams back and leaves (`gone`), and the pool manager replaces it.
    engine_check_seconds: PositiveFloat = 15.0
    engine_stall_seconds: PositiveFloat = 60.0
    # On SIGTERM the agent drains for this long; systemd's TimeoutStopSec must be longer.
    drain_grace_seconds: PositiveFloat = 90.0
    # Idle HTTP keep-alive; also how long a connection may take to send its request headers.
    keepalive_seconds: PositiveFloat = 75.0
    http_body_timeout_seconds: PositiveFloat = 30.0
    lifecycle: Lifecycle = "local"
    instance_type: str = "local"
    zone: str = "local"

    @model_validator(mode="after")
    def _heartbeat_within_ttl(self) -> Self:
        ttl = self.shared.registry.agent_ttl_seconds
        if self.heartbeat_seconds >= ttl:
            raise ValueError(
                f"heartbeat_seconds ({self.heartbeat_seconds}) must be below the agent TTL "
                f"({ttl}), or the registry entry expires between heartbeats"
            )
        return self


class Placement(_Section):
    """One (instance type, zone) the pool may launch into, with its hourly prices."""

    instance_type: str
    zone: str
    spot_price_per_hour: PositiveFloat
    on_demand_price_per_hour: PositiveFloat
    # The most streams one agent on this instance type serves: its launch record says so,
    # and gateways cap what the agent's own row claims at it.
    capacity: PositiveInt = DEFAULT_AGENT_CAPACITY


def advertised_url(settings: AgentSettings) -> str:
    """The base URL the gateway reaches an agent at (and its launcher vouches for)."""
    return settings.advertise_url or f"http://{settings.host}:{settings.port}"


class Ec2PoolSettings(_Section):
    """How the `ec2` provider launches agents."""

    pool_name: str = "spotgate"  # the `spotgate:pool` tag on every instance of this pool
    launch_template: str = "spotgate-agent"  # name (or `lt-…` id) of the agents' template
    subnets: dict[str, str] = Field(default_factory=dict)  # zone → subnet id (private)


class LocalPoolSettings(_Section):
    """How the `local` provider runs agents: subprocesses of the pool manager on this machine."""

    engine: EngineKind = "synthetic"
    jwks_url: str | None = None  # the gateway's JWKS, for the agents' token checks
    drain_grace_seconds: PositiveFloat = 20.0
    log_dir: str = ".spotgate/logs"
    agent_env: dict[str, str] = Field(default_factory=dict)  # more SPOTGATE_AGENT_… settings


class PoolModel(_Section):
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
    instance_types: tuple[str, ...] = ()  # of the pool's placements; empty: all of them
    launch_template: str | None = None  # ec2: this model's template; None: ec2.launch_template
    source: str = ""  # local: the agents' SPOTGATE_AGENT_MODEL (a directory); empty: none
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
    ec2: Ec2PoolSettings = Field(default_factory=Ec2PoolSettings)
    local: LocalPoolSettings = Field(default_factory=LocalPoolSettings)

    @field_validator("models", mode="before")
    @classmethod
    def _names_are_models(cls, models: Any) -> Any:
        if isinstance(models, (list, tuple)):
            return tuple({"name": m} if isinstance(m, str) else m for m in models)
        return models

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
            unknown = set(model.instance_types) - known if self.placements else set()
            if unknown:
                raise ValueError(
                    f"model {model.name}: instance types {sorted(unknown)} are in no placement"
                )
        return self

    def model(self, name: str) -> PoolModel | None:
        """The settings of the model called `name`, if the pool serves it."""
        return next((model for model in self.models if model.name == name), None)


EMULATOR_CREDENTIAL = "local"
"""An AWS emulator accepts any credentials; these keep boto from looking for real ones."""


def emulator_settings(endpoint_url: str, region: str) -> SharedSettings:
    """Shared settings (the rest from the environment) that reach an AWS emulator."""
    aws = AwsSettings(
        region=region,
        endpoint_url=endpoint_url,
        access_key_id=EMULATOR_CREDENTIAL,
        secret_access_key=SecretStr(EMULATOR_CREDENTIAL),
    )
    return SharedSettings().model_copy(update={"aws": aws})


def settings_env(settings: BaseSettings) -> dict[str, str]:
    """Environment variables that give a child process these settings.

    Every field set explicitly (or read from this process's environment) is written, nested
    sections with `__`, the shared settings under their own prefix; defaults are left to the
    child. So a stack is described once, as typed settings, and a new setting needs no code
    here. Secrets are written in clear: the child's environment is where they go.
    """
    config = settings.model_config
    prefix = str(config.get("env_prefix", ""))
    delimiter = str(config.get("env_nested_delimiter") or "__")
    env: dict[str, str] = {}
    for name in sorted(settings.model_fields_set):
        value = getattr(settings, name)
        if isinstance(value, BaseSettings):
            env.update(settings_env(value))
        else:
            _section_env(f"{prefix}{name}".upper(), value, delimiter, env)
    return env


def _section_env(variable: str, value: Any, delimiter: str, env: dict[str, str]) -> None:
    if isinstance(value, BaseModel):
        for name in sorted(value.model_fields_set):
            _section_env(
                f"{variable}{delimiter}{name.upper()}", getattr(value, name), delimiter, env
            )
    elif value is not None:  # unset is the only None a field takes from the environment
        plain = _plain(value)
        # Text as it is; numbers, booleans, tuples, lists and dicts as JSON, which
        # pydantic-settings reads back.
        env[variable] = plain if isinstance(plain, str) else json.dumps(plain)


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return {name: _plain(getattr(value, name)) for name in value.model_fields_set}
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    return value


def describe_validation_error(err: ValidationError) -> str:
    """Render a settings validation error as one line: `field: problem; field: problem`."""
    parts = []
    for problem in err.errors(include_url=False):
        where = ".".join(str(part) for part in problem["loc"]) or err.title
        parts.append(f"{where}: {problem['msg']}")
    return f"invalid {err.title} — " + "; ".join(parts)
