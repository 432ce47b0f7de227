"""The gateways' limit store: a Valkey serverless cache in the private subnets, reached by the
gateways' tasks only, and the gateway's settings that point at it."""

from __future__ import annotations

import re
from typing import Any

import pytest
from aws_cdk.assertions import Match
from conftest import Synthesized, render
from stacks.limit_store import cache_name

URL_ENV = "SPOTGATE_GATEWAY_LIMIT_STORE__URL"
CLUSTER_ENV = "SPOTGATE_GATEWAY_LIMIT_STORE__CLUSTER"
ELASTICACHE_NAME = re.compile(r"[a-z](?:[a-z0-9]|-(?=[a-z0-9])){0,39}")
"""A letter first, then letters, digits and single hyphens, none last; 40 at most."""


def _cache(synthesized: Synthesized) -> tuple[str, dict[str, Any]]:
    cache_id, cache = synthesized.one("AWS::ElastiCache::ServerlessCache")
    return cache_id, cache["Properties"]


def _cache_security_group(synthesized: Synthesized) -> str:
    _cache_id, cache = _cache(synthesized)
    (group,) = cache["SecurityGroupIds"]
    return str(group["Fn::GetAtt"][0])


def _service_network(synthesized: Synthesized, prefix: str) -> dict[str, Any]:
    (service,) = [
        service["Properties"]
        for logical_id, service in synthesized.resources("AWS::ECS::Service").items()
        if logical_id.startswith(prefix)
    ]
    return dict(service["NetworkConfiguration"]["AwsvpcConfiguration"])


def test_cache_is_valkey_serverless_in_the_gateways_private_subnets(
    synthesized: Synthesized,
) -> None:
    synthesized.template.resource_count_is("AWS::ElastiCache::ServerlessCache", 1)
    synthesized.template.has_resource_properties(
        "AWS::ElastiCache::ServerlessCache",
        {
            "Engine": "valkey",
            "MajorEngineVersion": "8",
            "ServerlessCacheName": "spotgate-limits",
            "CacheUsageLimits": {
                "DataStorage": {"Maximum": 1, "Unit": "GB"},
                "ECPUPerSecond": {"Maximum": 5000},
            },
            # No user group: the default user, as the gateway's client connects.
            "UserGroupId": Match.absent(),
        },
    )
    _cache_id, cache = _cache(synthesized)
    subnets = synthesized.resources("AWS::EC2::Subnet")
    cache_subnets = [subnet["Ref"] for subnet in cache["SubnetIds"]]
    assert len(cache_subnets) >= 2
    for subnet_id in cache_subnets:
        tags = subnets[subnet_id]["Properties"]["Tags"]
        assert {"Key": "aws-cdk:subnet-type", "Value": "Private"} in tags
    gateway = _service_network(synthesized, "Gateway")
    gateway_subnets = [subnet["Ref"] for subnet in gateway["Subnets"]]
    assert sorted(cache_subnets) == sorted(gateway_subnets)


def test_only_the_gateways_reach_the_cache_on_6379(synthesized: Synthesized) -> None:
    group_id = _cache_security_group(synthesized)
    group = synthesized.resources("AWS::EC2::SecurityGroup")[group_id]["Properties"]
    assert "SecurityGroupIngress" not in group  # no inline rule besides the one below
    # It opens no connections: CDK's "disallow all" placeholder is its only egress rule.
    assert [rule["CidrIp"] for rule in group["SecurityGroupEgress"]] == ["255.255.255.255/32"]

    (gateway_group,) = _service_network(synthesized, "Gateway")["SecurityGroups"]
    to_cache = {"Fn::GetAtt": [group_id, "GroupId"]}
    synthesized.template.resource_properties_count_is(
        "AWS::EC2::SecurityGroupIngress", {"GroupId": to_cache}, 1
    )
    synthesized.template.has_resource_properties(
        "AWS::EC2::SecurityGroupIngress",
        {
            "GroupId": to_cache,
            "IpProtocol": "tcp",
            "FromPort": 6379,
            "ToPort": 6379,
            "SourceSecurityGroupId": gateway_group,
            "CidrIp": Match.absent(),
        },
    )
    # The pool manager's and the agents' groups are other groups, with no rule to the cache.
    (pool_group,) = _service_network(synthesized, "PoolManager")["SecurityGroups"]
    _template_id, template = synthesized.one("AWS::EC2::LaunchTemplate")
    agent_groups = template["Properties"]["LaunchTemplateData"]["SecurityGroupIds"]
    assert pool_group != gateway_group
    assert gateway_group not in agent_groups


def test_gateway_is_pointed_at_the_cache_over_tls_in_cluster_mode(
    synthesized: Synthesized,
) -> None:
    for name, value in (
        (CLUSTER_ENV, "true"),
        (URL_ENV, {"Fn::Join": ["", Match.array_with(["rediss://"])]}),
    ):
        synthesized.template.has_resource_properties(
            "AWS::ECS::TaskDefinition",
            {
                "ContainerDefinitions": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "Name": "gateway",
                                "Environment": Match.array_with([{"Name": name, "Value": value}]),
                            }
                        )
                    ]
                )
            },
        )
    cache_id, _cache_props = _cache(synthesized)
    env = synthesized.container_env("gateway")
    assert render(env[URL_ENV]) == (
        f"rediss://<{cache_id}.Endpoint.Address>:<{cache_id}.Endpoint.Port>/0"
    )
    assert env[CLUSTER_ENV] == "true"
    pool_env = synthesized.container_env("pool-manager")
    assert not [name for name in pool_env if "LIMIT_STORE" in name]


@pytest.mark.parametrize(
    ("pool_name", "expected"),
    [
        ("spotgate", "spotgate-limits"),
        ("My_Pool.v2", "my-pool-v2-limits"),
        ("team--a__b", "team-a-b-limits"),
        ("9lives", "spotgate-9lives-limits"),
        ("___", "spotgate-limits"),
        ("a" * 40, "a" * 33 + "-limits"),
        ("a" * 32 + ".b", "a" * 32 + "-limits"),  # cut at a hyphen: none is left last
    ],
)
def test_cache_name_is_one_elasticache_accepts(pool_name: str, expected: str) -> None:
    name = cache_name(pool_name)
    assert name == expected
    assert ELASTICACHE_NAME.fullmatch(name), name
