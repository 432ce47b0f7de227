"""What every service's settings share: AWS, tables, registry timings, logging, sockets."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    SecretStr,
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


class SettingsSection(BaseModel):
    """A nested group of settings: unknown fields are an error, not silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class AwsSettings(SettingsSection):
    """Where the AWS APIs are: the real ones, or the emulator in local mode and tests."""

    region: str = "us-east-1"
    endpoint_url: str | None = None
    # Unset in production: boto's default chain (instance role, task role) is used.
    access_key_id: str | None = None
    secret_access_key: SecretStr | None = None


class TableNames(SettingsSection):
    """DynamoDB table names (ARCHITECTURE.md)."""

    agents: str = "spotgate-agents"
    keys: str = "spotgate-keys"
    demand: str = "spotgate-demand"
    usage: str = "spotgate-usage"
    launches: str = "spotgate-launches"
    # Files (`/v1/files`) and batches (`/v1/batches`): their records, leases and progress.
    batches: str = "spotgate-batches"


class RegistryTimings(SettingsSection):
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
    # The S3 bucket of the files' contents: uploads, and batches' output and error files.
    files_bucket: str = "spotgate-files"
    log_level: LogLevel = "info"
    log_format: LogFormat = "auto"

    def in_region(self, region: str) -> Self:
        """The same settings with AWS's APIs in `region` (a pool's other regions)."""
        return self.model_copy(update={"aws": self.aws.model_copy(update={"region": region})})


class SocketLimits(SettingsSection):
    """Limits on every websocket (ARCHITECTURE.md); each breach is a clear `error` frame."""

    # A client's frame; at most MAX_REQUEST_BYTES, so a gateway's link to an agent, sized
    # from it, carries every frame a legal request can make (`spotgate.protocol`).
    max_frame_bytes: Annotated[int, Field(gt=0, le=MAX_REQUEST_BYTES)] = DEFAULT_MAX_FRAME_BYTES
    heartbeat_seconds: PositiveFloat = 20.0
    idle_timeout_seconds: PositiveFloat = 300.0
    auth_timeout_seconds: PositiveFloat = 5.0
    max_streams_per_connection: PositiveInt = 16
    max_prompt_chars: PositiveInt = 200_000


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
