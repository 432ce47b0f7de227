"""Deployment settings: every knob of the stack and of each model, with their checks.

`stacks.context` reads them from CDK context (`cdk.json`, or `cdk deploy -c key=value`).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from ipaddress import IPv4Network

from spotgate.engine_flags import ENGINE_ARGS_ENV, own_flag_refusal
from spotgate.regions import unknown_regions, zone_region
from spotgate.settings import AgentSettings
from spotgate.settings_env_names import env_names, env_prefix

AGENT_SETTING_PREFIX = env_prefix(AgentSettings)
MODEL_SETTINGS = env_names(
    AgentSettings,
    {
        "model": "models[].model",
        "served_model_name": "models[].name",
        "model_fetch": "models[].fetch",
        "vllm.revision": "models[].revision",
        "vllm.tensor_parallel_size": "models[].tensorParallelSize",
        "vllm.engine_args": "models[].engineArgs",
        "vllm.tool_call_parser": "models[].toolCallParser",
        "vllm.reasoning_parser": "models[].reasoningParser",
        "vllm.chat_template": "models[].chatTemplate",
    },
)
"""Agent settings each model entry sets from its own keys: agentSettings may not set them too."""
GPUS_PER_INSTANCE_TYPE = {
    **{f"{family}.{size}": 1 for family in ("g4dn", "g5", "g6", "g6e")
       for size in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge")},
    **{f"{family}.{size}": 4 for family in ("g4dn", "g5", "g6", "g6e")
       for size in ("12xlarge", "24xlarge") if f"{family}.{size}" != "g4dn.24xlarge"},
    **{f"{family}.48xlarge": 8 for family in ("g5", "g6", "g6e")},
    "g4dn.metal": 8,
    "p3.2xlarge": 1, "p3.8xlarge": 4, "p3.16xlarge": 8, "p3dn.24xlarge": 8,
    "p4d.24xlarge": 8, "p4de.24xlarge": 8,
    "p5.4xlarge": 1, "p5.48xlarge": 8, "p5e.48xlarge": 8, "p5en.48xlarge": 8,
    "p6-b200.48xlarge": 8,
}  # fmt: skip
"""NVIDIA GPUs per EC2 instance type, as AWS lists them: a model's tensor-parallel size must
fit each type it may run on (an `instanceTypes` entry's `gpus` names a type not here)."""
MODEL_TAG_VALUE = re.compile(r"[\w ./=+@-]{1,256}")
"""An EC2 tag value (the model's name is its agents' `spotgate:model` tag), on one line, with
no `:` (`<name>:<adapter>` names a LoRA adapter)."""
TEMPLATE_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9().\-_]")
"""What a launch template name may not hold (`/` is allowed there, but not in a construct id)."""
LAUNCH_TEMPLATE_NAME_MAX = 128
POOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,40}")
"""The pool name prefixes table names and tags: DynamoDB's table name characters."""
ECR_IMAGE = re.compile(
    r"(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com/"
    r"(?P<repository>[a-z0-9._/-]+)(:[\w.-]+|@sha256:[0-9a-f]{64})"
)
"""An image in ECR, by tag or digest: what agents can pull with their role alone."""
SECURITY_GROUP_ID = re.compile(r"sg-[0-9a-f]{8,17}")
VPC_PREFIX_MIN = 16
VPC_PREFIX_MAX = 18
"""A VPC's CIDR: each zone takes a /20 private subnet and a /24 public one, three zones a /18."""
FARGATE_MAX_STOP_TIMEOUT_SECONDS = 120
"""Fargate sends SIGKILL at most this long after SIGTERM."""
STOP_TIMEOUT_MARGIN_SECONDS = 15
"""Time beyond the gateway's drain for the streams still open to hear `going_away` (5 s at
most), then for the process to close sockets and exit."""


class ConfigError(ValueError):
    """A context value that cannot deploy; the message names the key and the problem."""


@dataclass(frozen=True, slots=True)
class InstanceOption:
    """One GPU instance type the pool may launch, with the hourly prices its policy weighs."""

    instance_type: str
    spot_price_per_hour: float
    on_demand_price_per_hour: float
    gpus: int | None = None  # None: GPUS_PER_INSTANCE_TYPE's count

    @property
    def gpu_count(self) -> int | None:
        """Its GPUs: as given, else as AWS lists the type (None: a type the table lacks)."""
        return (
            self.gpus if self.gpus is not None else GPUS_PER_INSTANCE_TYPE.get(self.instance_type)
        )


@dataclass(frozen=True, slots=True)
class PoolRegionConfig:
    """Another region the pool places agents in: a VPC of its own, peered with the home one."""

    region: str
    vpc_cidr: str
    availability_zones: tuple[str, ...]

    def validate(self, where: str, home: str) -> None:
        """Raise `ConfigError`, naming `where` (`regions[0]`), for values that cannot deploy."""
        if unknown_regions([self.region]):
            raise ConfigError(f"{where}.region: no EC2 region is called {self.region!r}")
        if self.region == home:
            raise ConfigError(f"{where}.region: {home} is the home region (region) already")
        vpc_network(f"{where}.vpcCidr", self.vpc_cidr)
        if len(self.availability_zones) < 2:
            raise ConfigError(
                f"{where}.availabilityZones: name at least two zones of {self.region}"
            )
        for zone in self.availability_zones:
            if zone_region(zone) != self.region:
                raise ConfigError(f"{where}.availabilityZones: {zone} is not in {self.region}")


def vpc_network(key: str, cidr: str) -> IPv4Network:
    """`cidr` as a network a VPC of the stack's subnets fits in (/16 to /18)."""
    try:
        network = IPv4Network(cidr)
    except ValueError as err:
        raise ConfigError(f"{key}: {cidr!r} is no IPv4 network ({err})") from None
    if not VPC_PREFIX_MIN <= network.prefixlen <= VPC_PREFIX_MAX:
        raise ConfigError(
            f"{key}: a /{VPC_PREFIX_MIN} to /{VPC_PREFIX_MAX} network (its zones' subnets), "
            f"not /{network.prefixlen}"
        )
    return network


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """One model the pool serves: what its agents run, on which instance types, how many."""

    name: str
    model: str
    revision: str = ""
    # A staged model's weights (`model: s3://…`): streamed into the engine, or downloaded to
    # instance storage first (the agent's `model_fetch`).
    fetch: str = "stream"
    instance_types: tuple[str, ...] = ()
    tensor_parallel_size: int = 1
    engine_args: str = ""
    tool_call_parser: str = ""
    reasoning_parser: str = ""
    # A Jinja file in place of the model's own: relative, in the model's directory (staged
    # beside its weights), or absolute on the agent's image.
    chat_template: str = ""
    min_agents: int = 1
    max_agents: int = 4
    scale_to_zero_idle_seconds: int | None = None
    # Stopped on-demand instances kept for warm starts; their root volume keeps the model cache.
    warm_pool_size: int = 0
    root_volume_gib: int | None = None  # None: the pool's rootVolumeGiB
    agent_settings: tuple[tuple[str, str], ...] = ()

    @property
    def keeps_cache_on_stop(self) -> bool:
        """Whether its agents keep the model cache on the root volume, which a stop keeps."""
        return self.warm_pool_size > 0

    @property
    def safe_name(self) -> str:
        """The name with what a launch template name or construct id cannot hold made `-`."""
        return TEMPLATE_NAME_UNSAFE.sub("-", self.name)

    def validate(self, where: str, catalog: frozenset[str]) -> None:
        """Raise `ConfigError`, naming `where` (`models[0]`), for values that cannot deploy."""
        if not MODEL_TAG_VALUE.fullmatch(self.name):
            raise ConfigError(
                f"{where}.name: 1 to 256 letters, digits, spaces or _./=+-@ (an EC2 tag value; "
                "no ':', which names a LoRA adapter: '<name>:<adapter>')"
            )
        if not self.model:
            raise ConfigError(f"{where}.model: must name a model (a Hugging Face id or a path)")
        for key, text in (
            ("model", self.model),
            ("revision", self.revision),
            ("engineArgs", self.engine_args),
            ("toolCallParser", self.tool_call_parser),
            ("reasoningParser", self.reasoning_parser),
            ("chatTemplate", self.chat_template),
        ):
            # Each becomes one line of the agents' environment file.
            if "\n" in text or "\r" in text:
                raise ConfigError(f"{where}.{key}: one line")
        if self.fetch not in ("stream", "download"):
            raise ConfigError(f"{where}.fetch: stream or download")
        unknown = sorted(set(self.instance_types) - catalog)
        if unknown:
            raise ConfigError(
                f"{where}.instanceTypes: {', '.join(unknown)} not in the pool's instanceTypes"
            )
        if self.tensor_parallel_size < 1:
            raise ConfigError(f"{where}.tensorParallelSize: must be at least 1")
        if self.max_agents < max(self.min_agents, 1):
            raise ConfigError(f"{where}.maxAgents: must be at least 1 and at least minAgents")
        if self.scale_to_zero_idle_seconds is not None and self.scale_to_zero_idle_seconds < 1:
            raise ConfigError(f"{where}.scaleToZeroIdleSeconds: must be at least 1")
        if self.root_volume_gib is not None and self.root_volume_gib < 1:
            raise ConfigError(f"{where}.rootVolumeGiB: must be at least 1")
        # No more of its instances ever serve at once: stopped ones beyond that only cost.
        if self.warm_pool_size > self.max_agents:
            raise ConfigError(f"{where}.warmPoolSize: at most maxAgents ({self.max_agents})")
        # The agent refuses these at its start; said here, it is said before anything launches.
        try:
            flags = shlex.split(self.engine_args)
        except ValueError as err:
            raise ConfigError(f"{where}.engineArgs: {err}") from err
        refusal = own_flag_refusal(flags)
        if refusal is not None:
            raise ConfigError(f"{where}.engineArgs: {refusal.removeprefix(ENGINE_ARGS_ENV + ': ')}")
        _check_agent_settings(f"{where}.agentSettings", self.agent_settings)


def _check_tensor_parallel(where: str, model: ModelConfig, gpus: Mapping[str, int | None]) -> None:
    """Refuse a tensor-parallel size above the GPUs of a type the model may run on."""
    size = model.tensor_parallel_size
    for instance_type in model.instance_types or tuple(gpus):
        count = gpus[instance_type]
        if count is None and size > 1:
            raise ConfigError(
                f"instanceTypes: give {instance_type}'s gpus (its GPU count), which "
                f"{where}.tensorParallelSize {size} must fit"
            )
        if count is not None and size > count:
            raise ConfigError(
                f"{where}.tensorParallelSize: {size} GPUs, but {instance_type} has {count}; "
                f"give the model instanceTypes of {size} GPUs or more"
            )


def _check_agent_settings(key: str, settings: tuple[tuple[str, str], ...]) -> None:
    for name, setting in settings:
        if not name.startswith(AGENT_SETTING_PREFIX):
            raise ConfigError(f"{key}: {name!r} does not start with {AGENT_SETTING_PREFIX}")
        # Each setting is one line of the agents' environment file.
        if "\n" in setting or "\n" in name:
            raise ConfigError(f"{key}: {name!r} spans more than one line")
        # Setting names are case-insensitive to the agent.
        owner = MODEL_SETTINGS.get(name.upper())
        if owner is not None:
            raise ConfigError(f"{key}: {name} is set by {owner}, not here")


DEFAULT_MODEL = ModelConfig(
    name="Qwen/Qwen3-4B",
    model="Qwen/Qwen3-4B",
    # The Hub commit of Qwen/Qwen3-4B's weights, tokenizer and chat template.
    revision="1cfa9a7208912126459214e8b04321603b3df60c",
    tool_call_parser="hermes",
    reasoning_parser="qwen3",
)
"""A current open model with tool calls and reasoning that fits one 24 GB GPU (g5/g6.xlarge).

Of the 0.9 share of an A10G's or L4's 22.5 GiB that vLLM takes by default, Qwen3-4B's bf16
weights use about 7.5 GiB, leaving about 11 GiB of KV cache (about 80,000 tokens at 144 KiB
each): its whole 40,960-token context and dozens of streams at once. Qwen3-8B's 16.4 GB
would leave about 3.5 GiB, fewer tokens than one full context, so it would need a shorter
max_model_len and would hold few streams per agent.
"""


@dataclass(frozen=True, slots=True)
class DeployConfig:
    """Every deployment knob, with the defaults `cdk.json` also documents."""

    region: str = "us-east-1"
    pool_name: str = "spotgate"
    models: tuple[ModelConfig, ...] = (DEFAULT_MODEL,)
    instance_types: tuple[InstanceOption, ...] = (
        InstanceOption("g5.xlarge", 0.45, 1.006),
        InstanceOption("g6.xlarge", 0.40, 0.8048),
    )
    availability_zones: tuple[str, ...] = ()
    vpc_cidr: str = "10.0.0.0/16"
    # The pool's other regions: agents there, gateways, registry and pool manager at home.
    pool_regions: tuple[PoolRegionConfig, ...] = ()
    max_azs: int = 2
    nat_gateways: int = 1
    spot_overprovision: int = 1
    on_demand_fallback: bool = True
    launch_timeout_seconds: int = 1800
    agent_settings: tuple[tuple[str, str], ...] = ()
    ami_ssm_parameter: str = (
        "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id"
    )
    ami_root_device_name: str = "/dev/sda1"
    root_volume_gib: int = 200
    container_image: str = ""
    agent_image: str = ""
    gateway_domain: str = ""
    certificate_arn: str = ""
    allow_plain_http: bool = False
    gateway_min_tasks: int = 2
    gateway_max_tasks: int = 6
    gateway_cpu: int = 1024
    gateway_memory_mib: int = 2048
    gateway_drain_seconds: int = 30
    gateway_requests_per_target: int = 1000
    alb_idle_timeout_seconds: int = 3600
    # What scrapes the gateways' operations port (`/metrics`, `/readyz`): a security group id,
    # admitted to that port only; empty: nothing is.
    ops_scraper_security_group: str = ""
    log_retention_days: int = 30
    interruption_alarm_per_hour: int = 3
    queue_alarm_minutes: int = 3
    alarm_topic_arn: str = ""

    @property
    def model_names(self) -> list[str]:
        """The names clients ask for, one per model."""
        return [model.name for model in self.models]

    def root_volume_of(self, model: ModelConfig) -> int:
        """The size in GiB of `model`'s agents' root volume: its own, else the pool's."""
        return self.root_volume_gib if model.root_volume_gib is None else model.root_volume_gib

    def launch_template_name(self, model: ModelConfig) -> str:
        """The name of `model`'s launch template: `<poolName>-agent-<name made safe>`."""
        return f"{self.pool_name}-agent-{model.safe_name}"

    @property
    def jwks_parameter(self) -> str:
        """The SSM parameter the gateways publish their public keys to, for the agents."""
        return f"/{self.pool_name}/gateway-jwks"

    def gateway_url(self, host: str) -> str:
        """The gateways' public URL at `host`: the token issuer agents check."""
        return f"{'https' if self.https else 'http'}://{host}"

    @property
    def https(self) -> bool:
        """Whether the gateway listens on HTTPS (a certificate was given)."""
        return bool(self.certificate_arn)

    @property
    def gateway_stop_timeout_seconds(self) -> int:
        """How long ECS waits after SIGTERM: the drain plus a margin, within Fargate's cap."""
        return min(
            self.gateway_drain_seconds + STOP_TIMEOUT_MARGIN_SECONDS,
            FARGATE_MAX_STOP_TIMEOUT_SECONDS,
        )

    def validate(self) -> None:
        """Raise `ConfigError` for values that would deploy a broken stack."""
        if not POOL_NAME.fullmatch(self.pool_name):
            raise ConfigError("poolName: 1 to 40 letters, digits, '-', '_' or '.'")
        for key, number in (
            ("rootVolumeGiB", self.root_volume_gib),
            ("gatewayRequestsPerTarget", self.gateway_requests_per_target),
            ("interruptionAlarmPerHour", self.interruption_alarm_per_hour),
            ("queueAlarmMinutes", self.queue_alarm_minutes),
            ("launchTimeoutSeconds", self.launch_timeout_seconds),
        ):
            if number < 1:
                raise ConfigError(f"{key}: must be at least 1")
        if not self.certificate_arn and not self.allow_plain_http:
            raise ConfigError(
                "certificateArn: the gateway serves HTTPS only; give an ACM certificate for "
                "gatewayDomain (API keys, tokens and prompts cross the internet), or set "
                "allowPlainHttp to true for a throwaway test stack"
            )
        if not self.instance_types:
            raise ConfigError("instanceTypes: give at least one GPU instance type")
        for option in self.instance_types:
            if option.gpus is not None and option.gpus < 1:
                raise ConfigError(f"instanceTypes: {option.instance_type}'s gpus: at least 1")
        if self.max_azs < 2 and len(self.availability_zones) < 2:
            raise ConfigError("maxAzs: the VPC spans at least two availability zones")
        if 0 < len(self.availability_zones) < 2:
            raise ConfigError("availabilityZones: name at least two zones, or none")
        if self.gateway_min_tasks < 1 or self.gateway_max_tasks < self.gateway_min_tasks:
            raise ConfigError("gatewayMinTasks/gatewayMaxTasks: need 1 <= min <= max")
        if self.gateway_drain_seconds + STOP_TIMEOUT_MARGIN_SECONDS > (
            FARGATE_MAX_STOP_TIMEOUT_SECONDS
        ):
            raise ConfigError(
                "gatewayDrainSeconds: Fargate stops a task at most "
                f"{FARGATE_MAX_STOP_TIMEOUT_SECONDS} s after SIGTERM; keep the drain at or below "
                f"{FARGATE_MAX_STOP_TIMEOUT_SECONDS - STOP_TIMEOUT_MARGIN_SECONDS} s"
            )
        if not 1 <= self.alb_idle_timeout_seconds <= 4000:
            raise ConfigError("albIdleTimeoutSeconds: the ALB accepts 1 to 4000 seconds")
        _check_agent_settings("agentSettings", self.agent_settings)
        self._validate_models()
        self._validate_regions()
        image = ECR_IMAGE.fullmatch(self.agent_image)
        if self.agent_image and (image is None or image["region"] != self.region):
            raise ConfigError(
                "agentImage: an ECR image in the stack's region, which the agents' role can "
                f"pull: <account>.dkr.ecr.{self.region}.amazonaws.com/<repository>:<tag> or "
                "@sha256:<digest>"
            )
        if self.ops_scraper_security_group and not SECURITY_GROUP_ID.fullmatch(
            self.ops_scraper_security_group
        ):
            raise ConfigError("opsScraperSecurityGroup: a security group id, sg-…, or empty")

    def _validate_models(self) -> None:
        if not self.models:
            raise ConfigError("models: give at least one model")
        catalog = frozenset(option.instance_type for option in self.instance_types)
        gpus = {option.instance_type: option.gpu_count for option in self.instance_types}
        names: dict[str, int] = {}
        templates: dict[str, int] = {}
        for index, model in enumerate(self.models):
            where = f"models[{index}]"
            model.validate(where, catalog)
            _check_tensor_parallel(where, model, gpus)
            if model.warm_pool_size > 0 and not self.on_demand_fallback:
                raise ConfigError(
                    f"{where}.warmPoolSize: the warm pool's instances are on-demand cover, which "
                    "onDemandFallback false never starts; set it to true or the size to 0"
                )
            if model.name in names:
                raise ConfigError(
                    f"{where}.name: {model.name!r} is models[{names[model.name]}]'s already"
                )
            names[model.name] = index
            template = self.launch_template_name(model)
            if template in templates:
                raise ConfigError(
                    f"{where}.name: its launch template name {template} is "
                    f"models[{templates[template]}]'s too; make the names differ in letters "
                    "or digits"
                )
            templates[template] = index
            if len(template) > LAUNCH_TEMPLATE_NAME_MAX:
                raise ConfigError(
                    f"{where}.name: its launch template name {template} is longer than "
                    f"{LAUNCH_TEMPLATE_NAME_MAX} characters"
                )

    def _validate_regions(self) -> None:
        if self.pool_regions and not self.gateway_domain:
            raise ConfigError(
                "regions: agents in other regions check the gateways' tokens against their "
                "public name, known before deploy only as gatewayDomain; set it"
            )
        for zone in self.availability_zones:
            if zone_region(zone) != self.region:
                raise ConfigError(f"availabilityZones: {zone} is not in {self.region}")
        networks = {"the home VPC's (vpcCidr)": vpc_network("vpcCidr", self.vpc_cidr)}
        seen: dict[str, int] = {}
        for index, pool_region in enumerate(self.pool_regions):
            where = f"regions[{index}]"
            pool_region.validate(where, self.region)
            if pool_region.region in seen:
                raise ConfigError(
                    f"{where}.region: {pool_region.region} is regions[{seen[pool_region.region]}]'s"
                )
            seen[pool_region.region] = index
            network = IPv4Network(pool_region.vpc_cidr)
            for whose, other in networks.items():
                if network.overlaps(other):
                    raise ConfigError(
                        f"{where}.vpcCidr: {network} overlaps {whose} {other}: peered VPCs "
                        "need addresses of their own"
                    )
            networks[f"{where}.vpcCidr"] = network

    @property
    def all_regions(self) -> tuple[str, ...]:
        """Where the pool places agents: the home region first, then the others."""
        return (self.region, *(r.region for r in self.pool_regions))
