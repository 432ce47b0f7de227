"""Deployment settings read from CDK context (`cdk.json`, or `cdk deploy -c key=value`)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from constructs import Node

AGENT_SETTING_PREFIX = "SPOTGATE_AGENT_"
POOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,40}")
"""The pool name prefixes table names and tags: DynamoDB's table name characters."""
ECR_IMAGE = re.compile(
    r"(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com/"
    r"(?P<repository>[a-z0-9._/-]+)(:[\w.-]+|@sha256:[0-9a-f]{64})"
)
"""An image in ECR, by tag or digest: what agents can pull with their role alone."""
SECURITY_GROUP_ID = re.compile(r"sg-[0-9a-f]{8,17}")
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


@dataclass(frozen=True, slots=True)
class DeployConfig:
    """Every deployment knob, with the defaults `cdk.json` also documents."""

    region: str = "us-east-1"
    pool_name: str = "spotgate"
    model: str = "Qwen/Qwen2.5-1.5B-Instruct"
    model_revision: str = ""
    served_model_name: str = ""
    # A staged model's weights (`model: s3://…`): streamed into the engine, or downloaded to
    # instance storage first (the agent's `model_fetch`).
    model_fetch: str = "stream"
    instance_types: tuple[InstanceOption, ...] = (
        InstanceOption("g5.xlarge", 0.45, 1.006),
        InstanceOption("g6.xlarge", 0.40, 0.8048),
    )
    availability_zones: tuple[str, ...] = ()
    max_azs: int = 2
    nat_gateways: int = 1
    min_agents: int = 1
    max_agents: int = 4
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
    def served_model(self) -> str:
        """The name clients ask for: `servedModelName`, else the model itself."""
        return self.served_model_name or self.model

    @property
    def jwks_parameter(self) -> str:
        """The SSM parameter the gateways publish their public keys to, for the agents."""
        return f"/{self.pool_name}/gateway-jwks"

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
        if not self.model:
            raise ConfigError("model: must name a model (a Hugging Face id or a path)")
        if not self.certificate_arn and not self.allow_plain_http:
            raise ConfigError(
                "certificateArn: the gateway serves HTTPS only; give an ACM certificate for "
                "gatewayDomain (API keys, tokens and prompts cross the internet), or set "
                "allowPlainHttp to true for a throwaway test stack"
            )
        if not self.instance_types:
            raise ConfigError("instanceTypes: give at least one GPU instance type")
        if self.max_agents < max(self.min_agents, 1):
            raise ConfigError("maxAgents: must be at least 1 and at least minAgents")
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
        for name, setting in self.agent_settings:
            if not name.startswith(AGENT_SETTING_PREFIX):
                raise ConfigError(f"agentSettings: {name!r} does not start with SPOTGATE_AGENT_")
            # Each setting is one line of the agents' environment file.
            if "\n" in setting or "\n" in name:
                raise ConfigError(f"agentSettings: {name!r} spans more than one line")
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
        if self.model_fetch not in ("stream", "download"):
            raise ConfigError("modelFetch: stream or download")
        if "\n" in self.model or "\n" in self.served_model or "\n" in self.model_revision:
            raise ConfigError("model/modelRevision/servedModelName: one line each")


_CONTEXT_KEYS: dict[str, str] = {
    "region": "region",
    "poolName": "pool_name",
    "model": "model",
    "modelRevision": "model_revision",
    "servedModelName": "served_model_name",
    "modelFetch": "model_fetch",
    "instanceTypes": "instance_types",
    "availabilityZones": "availability_zones",
    "maxAzs": "max_azs",
    "natGateways": "nat_gateways",
    "minAgents": "min_agents",
    "maxAgents": "max_agents",
    "spotOverprovision": "spot_overprovision",
    "onDemandFallback": "on_demand_fallback",
    "launchTimeoutSeconds": "launch_timeout_seconds",
    "agentSettings": "agent_settings",
    "amiSsmParameter": "ami_ssm_parameter",
    "amiRootDeviceName": "ami_root_device_name",
    "rootVolumeGiB": "root_volume_gib",
    "containerImage": "container_image",
    "agentImage": "agent_image",
    "gatewayDomain": "gateway_domain",
    "certificateArn": "certificate_arn",
    "allowPlainHttp": "allow_plain_http",
    "gatewayMinTasks": "gateway_min_tasks",
    "gatewayMaxTasks": "gateway_max_tasks",
    "gatewayCpu": "gateway_cpu",
    "gatewayMemoryMiB": "gateway_memory_mib",
    "gatewayDrainSeconds": "gateway_drain_seconds",
    "gatewayRequestsPerTarget": "gateway_requests_per_target",
    "albIdleTimeoutSeconds": "alb_idle_timeout_seconds",
    "opsScraperSecurityGroup": "ops_scraper_security_group",
    "logRetentionDays": "log_retention_days",
    "interruptionAlarmPerHour": "interruption_alarm_per_hour",
    "queueAlarmMinutes": "queue_alarm_minutes",
    "alarmTopicArn": "alarm_topic_arn",
}
"""Context key (camelCase, as in `cdk.json`) → field of `DeployConfig`."""

CONTEXT_KEYS = tuple(_CONTEXT_KEYS)


def _decoded(raw: Any) -> Any:
    # `cdk deploy -c key=value` hands every value in as a string; JSON covers lists and numbers.
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def _as_str(key: str, value: Any) -> str:
    if isinstance(value, (dict, list)):
        raise ConfigError(f"{key}: expected text, got {type(value).__name__}")
    return str(value)


def _as_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise ConfigError(f"{key}: expected a whole number, got {value!r}")
    if value < 0:
        raise ConfigError(f"{key}: must be zero or more, got {value!r}")
    return int(value)


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise ConfigError(f"{key}: expected true or false, got {value!r}")


def _as_instance_types(key: str, value: Any) -> tuple[InstanceOption, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{key}: expected a list of instance type entries")
    options = []
    for entry in value:
        try:
            options.append(
                InstanceOption(
                    instance_type=str(entry["instanceType"]),
                    spot_price_per_hour=float(entry["spotPricePerHour"]),
                    on_demand_price_per_hour=float(entry["onDemandPricePerHour"]),
                )
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ConfigError(
                f"{key}: each entry needs instanceType, spotPricePerHour, onDemandPricePerHour"
            ) from err
    return tuple(options)


def _convert(key: str, field_name: str, raw: Any) -> Any:
    value = _decoded(raw)
    default = getattr(DeployConfig(), field_name)
    if field_name == "instance_types":
        return _as_instance_types(key, value)
    if field_name == "availability_zones":
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list of zone names")
        return tuple(str(zone) for zone in value)
    if field_name == "agent_settings":
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected an object of SPOTGATE_AGENT_… settings")
        return tuple(sorted((str(name), str(setting)) for name, setting in value.items()))
    if isinstance(default, bool):
        return _as_bool(key, value)
    if isinstance(default, int):
        return _as_int(key, value)
    return _as_str(key, value)


def config_from_context(node: Node) -> DeployConfig:
    """The deployment settings: each context key that is set, the defaults for the rest."""
    values: dict[str, Any] = {}
    for key, field_name in _CONTEXT_KEYS.items():
        raw = node.try_get_context(key)
        if raw is not None:
            values[field_name] = _convert(key, field_name, raw)
    config = DeployConfig(**values)
    config.validate()
    return config


def config_as_context(config: DeployConfig) -> Mapping[str, Any]:
    """The context that reproduces `config` (what `cdk.json` holds for the defaults)."""
    by_field = {field_name: key for key, field_name in _CONTEXT_KEYS.items()}
    context: dict[str, Any] = {}
    for item in fields(config):
        value = getattr(config, item.name)
        key = by_field[item.name]
        if item.name == "instance_types":
            context[key] = [
                {
                    "instanceType": option.instance_type,
                    "spotPricePerHour": option.spot_price_per_hour,
                    "onDemandPricePerHour": option.on_demand_price_per_hour,
                }
                for option in value
            ]
        elif item.name == "agent_settings":
            context[key] = dict(value)
        elif isinstance(value, tuple):
            context[key] = list(value)
        else:
            context[key] = value
    return context
