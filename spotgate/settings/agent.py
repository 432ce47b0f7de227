"""The GPU agent's settings (`SPOTGATE_AGENT_…`)."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import (
    Field,
    PositiveFloat,
    PositiveInt,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from spotgate.settings.shared import (
    AwsSettings,
    EngineKind,
    Lifecycle,
    NonNegativeInt,
    ServedName,
    SettingsSection,
    SharedSettings,
    SocketLimits,
)


class ModelServing(SettingsSection):
    """How one model is served: its parsers, chat template and further engine arguments.

    Each model has its own (`spotgate up --model … --tool-call-parser …`, a pool model's
    `serving`, the CDK's `models[]`); `spotgate model inspect` finds them in a model's files.
    """

    # vLLM's `--tool-call-parser` for this model (`hermes` for Qwen2.5/Qwen3 and Hermes, …):
    # how the calls a model makes of its own accord (`tool_choice: auto`) are read from its
    # text. None: such requests are refused with a 400 naming `tool_choice`.
    tool_call_parser: str | None = None
    # vLLM's `--reasoning-parser` for this model (`qwen3`, `deepseek_r1`, …): how the model's
    # thinking is told from its answer, streamed as `reasoning_content`. None: no reasoning
    # output (a request asking for reasoning settings is refused naming them).
    reasoning_parser: str | None = None
    # The chat template, as vLLM's `--chat-template` takes it: a Jinja file (a relative path is
    # read in the model's directory) or the template's text. None: the model's own.
    chat_template: str | None = None
    # Every other engine argument of vLLM's, as `vllm serve` takes it (`--quantization awq
    # --kv-cache-dtype fp8 --max-num-batched-tokens 8192`): read by vLLM's own parser when the
    # engine starts; one it does not know, or of the wrong type, stops the start naming it.
    # The arguments set by settings of their own are refused here (gpu_agent/engine_args.py).
    engine_args: str = ""


class VllmSettings(ModelServing):
    """Engine arguments handed to vLLM's `AsyncLLM`: the model's serving, then the engine's."""

    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = "auto"
    max_model_len: PositiveInt | None = None
    max_num_seqs: PositiveInt = 64
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.9
    tensor_parallel_size: PositiveInt = 1
    enforce_eager: bool = False
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


class SyntheticSettings(SettingsSection):
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
    # The region of a staged model's bucket: the agent's own, where its pool spans regions
    # (the registry and the gateways' keys stay in `shared.aws.region`); None: that one.
    model_region: str | None = None
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

    @property
    def served_name(self) -> str:
        """The name the model is served under (a synthetic agent given none: `synthetic`)."""
        return self.served_model_name or self.model or self.engine

    @model_validator(mode="after")
    def _heartbeat_within_ttl(self) -> Self:
        ttl = self.shared.registry.agent_ttl_seconds
        if self.heartbeat_seconds >= ttl:
            raise ValueError(
                f"heartbeat_seconds ({self.heartbeat_seconds}) must be below the agent TTL "
                f"({ttl}), or the registry entry expires between heartbeats"
            )
        return self


def model_store_aws(settings: AgentSettings) -> AwsSettings:
    """Where the agent reads a staged model: its bucket's region (`model_region`)."""
    aws = settings.shared.aws
    return (
        aws
        if settings.model_region is None
        else aws.model_copy(update={"region": settings.model_region})
    )


def advertised_url(settings: AgentSettings) -> str:
    """The base URL the gateway reaches an agent at (and its launcher vouches for)."""
    return settings.advertise_url or f"http://{settings.host}:{settings.port}"
