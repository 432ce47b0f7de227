"""Deployment settings read from CDK context (`cdk.json`, or `cdk deploy -c key=value`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any

from constructs import Node

from stacks.config import (
    AGENT_SETTING_PREFIX,
    ConfigError,
    DeployConfig,
    InstanceOption,
    ModelConfig,
    PoolRegionConfig,
)

MOVED_KEYS = {
    "model": "models[].model",
    "modelRevision": "models[].revision",
    "servedModelName": "models[].name",
    "modelFetch": "models[].fetch",
    "minAgents": "models[].minAgents",
    "maxAgents": "models[].maxAgents",
}
"""Context keys of a one-model pool, and where each moved when the pool took a list of models."""

_CONTEXT_KEYS: dict[str, str] = {
    "region": "region",
    "poolName": "pool_name",
    "models": "models",
    "instanceTypes": "instance_types",
    "availabilityZones": "availability_zones",
    "vpcCidr": "vpc_cidr",
    "regions": "pool_regions",
    "maxAzs": "max_azs",
    "natGateways": "nat_gateways",
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
                    gpus=_as_optional_int(f"{key}[].gpus", entry.get("gpus")),
                )
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ConfigError(
                f"{key}: each entry needs instanceType, spotPricePerHour, onDemandPricePerHour "
                "(and gpus, for a type AWS's table here lacks)"
            ) from err
    return tuple(options)


def _as_settings(key: str, value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: expected an object of {AGENT_SETTING_PREFIX}… settings")
    return tuple(sorted((str(name), str(setting)) for name, setting in value.items()))


def _as_names(key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{key}: expected a list of names")
    return tuple(_as_str(key, name) for name in value)


def _as_optional_int(key: str, value: Any) -> int | None:
    return None if value is None else _as_int(key, value)


_MODEL_KEYS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "name": ("name", _as_str),
    "model": ("model", _as_str),
    "revision": ("revision", _as_str),
    "fetch": ("fetch", _as_str),
    "instanceTypes": ("instance_types", _as_names),
    "tensorParallelSize": ("tensor_parallel_size", _as_int),
    "engineArgs": ("engine_args", _as_str),
    "toolCallParser": ("tool_call_parser", _as_str),
    "reasoningParser": ("reasoning_parser", _as_str),
    "chatTemplate": ("chat_template", _as_str),
    "minAgents": ("min_agents", _as_int),
    "maxAgents": ("max_agents", _as_int),
    "scaleToZeroIdleSeconds": ("scale_to_zero_idle_seconds", _as_optional_int),
    "warmPoolSize": ("warm_pool_size", _as_int),
    "rootVolumeGiB": ("root_volume_gib", _as_optional_int),
    "agentSettings": ("agent_settings", _as_settings),
}
"""Key of a `models` entry → field of `ModelConfig`, and how its value is read."""

MODEL_KEYS = tuple(_MODEL_KEYS)
REQUIRED_MODEL_KEYS = ("name", "model")


def _as_model(where: str, entry: Any) -> ModelConfig:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected an object with at least name and model")
    # A misspelt key would otherwise be dropped without a word.
    unknown = sorted(set(entry) - set(_MODEL_KEYS))
    if unknown:
        raise ConfigError(
            f"{where}: unknown keys {', '.join(unknown)} (known: {', '.join(MODEL_KEYS)})"
        )
    for key in REQUIRED_MODEL_KEYS:
        if key not in entry:
            raise ConfigError(f"{where}.{key}: required")
    values = {
        field_name: read(f"{where}.{key}", entry[key])
        for key, (field_name, read) in _MODEL_KEYS.items()
        if key in entry
    }
    return ModelConfig(**values)


def _as_models(key: str, value: Any) -> tuple[ModelConfig, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{key}: expected a list of model entries")
    return tuple(_as_model(f"{key}[{index}]", entry) for index, entry in enumerate(value))


REGION_KEYS = ("region", "vpcCidr", "availabilityZones")
"""Keys of a `regions` entry, each required."""


def _as_pool_regions(key: str, value: Any) -> tuple[PoolRegionConfig, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{key}: expected a list of region entries")
    regions = []
    for index, entry in enumerate(value):
        where = f"{key}[{index}]"
        if not isinstance(entry, dict) or set(entry) != set(REGION_KEYS):
            raise ConfigError(f"{where}: expected an object with exactly {', '.join(REGION_KEYS)}")
        regions.append(
            PoolRegionConfig(
                region=_as_str(f"{where}.region", entry["region"]),
                vpc_cidr=_as_str(f"{where}.vpcCidr", entry["vpcCidr"]),
                availability_zones=_as_names(
                    f"{where}.availabilityZones", entry["availabilityZones"]
                ),
            )
        )
    return tuple(regions)


def _convert(key: str, field_name: str, raw: Any) -> Any:
    value = _decoded(raw)
    default = getattr(DeployConfig(), field_name)
    if field_name == "models":
        return _as_models(key, value)
    if field_name == "instance_types":
        return _as_instance_types(key, value)
    if field_name == "pool_regions":
        return _as_pool_regions(key, value)
    if field_name == "availability_zones":
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list of zone names")
        return tuple(str(zone) for zone in value)
    if field_name == "agent_settings":
        return _as_settings(key, value)
    if isinstance(default, bool):
        return _as_bool(key, value)
    if isinstance(default, int):
        return _as_int(key, value)
    return _as_str(key, value)


def config_from_context(node: Node) -> DeployConfig:
    """The deployment settings: each context key that is set, the defaults for the rest."""
    for key, moved_to in MOVED_KEYS.items():
        if node.try_get_context(key) is not None:
            raise ConfigError(f"{key}: moved into {moved_to}; see README.md, Deploy to AWS")
    values: dict[str, Any] = {}
    for key, field_name in _CONTEXT_KEYS.items():
        raw = node.try_get_context(key)
        if raw is not None:
            values[field_name] = _convert(key, field_name, raw)
    config = DeployConfig(**values)
    config.validate()
    return config


def model_as_context(model: ModelConfig) -> dict[str, Any]:
    """The `models` entry that reproduces `model` (every key; those left unset left out)."""
    by_field = {field_name: key for key, (field_name, _read) in _MODEL_KEYS.items()}
    entry: dict[str, Any] = {}
    for item in fields(model):
        value = getattr(model, item.name)
        if item.name == "agent_settings":
            entry[by_field[item.name]] = dict(value)
        elif isinstance(value, tuple):
            entry[by_field[item.name]] = list(value)
        elif value is not None:
            entry[by_field[item.name]] = value
    return entry


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
                    **({"gpus": option.gpus} if option.gpus is not None else {}),
                }
                for option in value
            ]
        elif item.name == "models":
            context[key] = [model_as_context(model) for model in value]
        elif item.name == "pool_regions":
            context[key] = [
                {
                    "region": r.region,
                    "vpcCidr": r.vpc_cidr,
                    "availabilityZones": list(r.availability_zones),
                }
                for r in value
            ]
        elif item.name == "agent_settings":
            context[key] = dict(value)
        elif isinstance(value, tuple):
            context[key] = list(value)
        else:
            context[key] = value
    return context
