"""The edge gateway's settings (`SPOTGATE_GATEWAY_…`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Self

from pydantic import (
    Field,
    IPvAnyNetwork,
    PositiveFloat,
    PositiveInt,
    SecretStr,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from spotgate.settings.shared import (
    TOKEN_TTL_MAX_SECONDS,
    NonNegativeInt,
    ServedName,
    SettingsSection,
    SharedSettings,
    SocketLimits,
)


class TokenSettings(SettingsSection):
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


class QueueSettings(SettingsSection):
    """The per-model wait queue used while the pool scales (issue: serverless queueing)."""

    max_pending_per_model: PositiveInt = 256
    deadline_seconds: PositiveFloat = 120.0
    # A flex stream (`service_tier: flex`) waits this long for capacity others leave.
    flex_deadline_seconds: PositiveFloat = 900.0
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

    def tier_deadline_seconds(self, service_tier: str | None) -> float:
        """How long a stream of the tier waits for an agent."""
        return self.flex_deadline_seconds if service_tier == "flex" else self.deadline_seconds


class RoutingSettings(SettingsSection):
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


class LimitStoreSettings(SettingsSection):
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


class BatchSettings(SettingsSection):
    """The Files and Batch APIs: OpenAI's limits, and how each replica works the batches."""

    # An uploaded file, at most (OpenAI's limit for a batch's input file is 200 MB).
    max_file_bytes: PositiveInt = 200 * 1000 * 1000
    # Requests in one batch, at most (OpenAI's).
    max_requests: PositiveInt = 50_000
    # Uploads one replica reads at once: each is held whole while it is checked.
    uploads_per_gateway: PositiveInt = 2
    # Downloads one replica streams at once: each holds one of its S3 client's 10 connections
    # for as long as its client reads, so a few slow readers must not take them all.
    downloads_per_gateway: PositiveInt = 4
    # An upload not received in full within this long is answered 408.
    upload_timeout_seconds: PositiveFloat = 600.0
    # A batch's requests one replica runs or queues at once, in the flex tier (behind every
    # interactive stream).
    streams_per_gateway: PositiveInt = 16
    # How long a replica's claim on a batch lasts unless renewed: another replica takes
    # the batch on this long after its worker died.
    lease_seconds: PositiveFloat = 30.0
    # How often each replica looks for batches no live replica works.
    poll_seconds: PositiveFloat = 5.0
    # A batch request's time on an agent, assumed until the batch has measured its own: the
    # backlog the pool manager adds spot capacity for, when it would miss its window.
    request_seconds_estimate: PositiveFloat = 20.0


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
    batch: BatchSettings = BatchSettings()
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
