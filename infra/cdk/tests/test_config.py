"""Context values that cannot deploy are refused with one line naming the key."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
import pytest
from stacks.common import retention
from stacks.config import ConfigError, DeployConfig, config_from_context


def _config(context: dict[str, Any]) -> DeployConfig:
    return config_from_context(cdk.App(context=context).node)


def _plain(context: dict[str, Any]) -> DeployConfig:
    """`_config` for a stack that may listen on plain HTTP: the other checks' turn."""
    return _config({"allowPlainHttp": True, **context})


def test_no_context_gives_the_defaults_which_need_a_certificate() -> None:
    with pytest.raises(ConfigError, match=r"^certificateArn: the gateway serves HTTPS only"):
        _config({})
    assert _config({"allowPlainHttp": True}) == DeployConfig(allow_plain_http=True)
    certificate = "arn:aws:acm:us-east-1:123456789012:certificate/0"
    assert _config({"certificateArn": certificate}).https


@pytest.mark.parametrize(
    ("context", "key"),
    [
        ({"minAgents": 5, "maxAgents": 2}, "maxAgents"),
        ({"minAgents": "-1"}, "minAgents"),
        ({"maxAzs": 1}, "maxAzs"),
        ({"availabilityZones": ["us-east-1a"]}, "availabilityZones"),
        ({"gatewayDrainSeconds": 110}, "gatewayDrainSeconds"),
        ({"albIdleTimeoutSeconds": 5000}, "albIdleTimeoutSeconds"),
        ({"agentSettings": {"SPOTGATE_POOL_MIN_AGENTS": "1"}}, "agentSettings"),
        ({"instanceTypes": [{"instanceType": "g5.xlarge"}]}, "instanceTypes"),
        ({"instanceTypes": []}, "instanceTypes"),
        ({"onDemandFallback": "yes"}, "onDemandFallback"),
        ({"model": ""}, "model"),
        ({"poolName": "my pool"}, "poolName"),
        ({"rootVolumeGiB": 0}, "rootVolumeGiB"),
        ({"agentSettings": {"SPOTGATE_AGENT_MODEL": "a\nb"}}, "agentSettings"),
        ({"agentImage": "docker.io/vllm/vllm-openai:latest"}, "agentImage"),
        # ECR logins are per region: the agents log in to the stack's
        ({"agentImage": "123456789012.dkr.ecr.eu-west-1.amazonaws.com/a:1"}, "agentImage"),
        ({"modelFetch": "copy"}, "modelFetch"),
        ({"opsScraperSecurityGroup": "0.0.0.0/0"}, "opsScraperSecurityGroup"),
    ],
)
def test_bad_values_name_their_key(context: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{key}: "):
        _plain(context)


def test_log_retention_must_be_a_cloudwatch_period() -> None:
    assert retention(30).name == "ONE_MONTH"
    with pytest.raises(ConfigError, match=r"^logRetentionDays: 31 is not one of"):
        retention(31)
