"""The gateways' shared limit store: an ElastiCache Serverless (Valkey) cache in the VPC."""

from __future__ import annotations

import re

from aws_cdk import RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_elasticache as elasticache
from constructs import Construct

from spotgate.settings import GatewaySettings
from spotgate.settings_env_names import env_names
from stacks.config import DeployConfig

ENGINE = "valkey"
MAJOR_ENGINE_VERSION = "8"
PORT = 6379
"""The serverless endpoint's port (its reader endpoint, 6380, is not used)."""
MAX_DATA_STORAGE_GB = 1
MAX_ECPU_PER_SECOND = 5000
MAX_NAME_CHARS = 40
NAME_SUFFIX = "-limits"


def cache_name(pool_name: str) -> str:
    """The cache's name, `<poolName>-limits` in the letters ElastiCache accepts in names."""
    # ElastiCache names: lowercase letters, digits and single hyphens, a letter first, at
    # most 40 characters; pool names may also hold '_', '.' and capitals.
    words = re.findall(r"[a-z0-9]+", pool_name.lower())
    if not words or not words[0][0].isalpha():
        words.insert(0, "spotgate")
    prefix = "-".join(words)[: MAX_NAME_CHARS - len(NAME_SUFFIX)].rstrip("-")
    return prefix + NAME_SUFFIX


class LimitStore(Construct):
    """A Valkey cache (TLS, cluster mode) that only the gateways' tasks can reach."""

    def __init__(
        self, scope: Construct, construct_id: str, *, config: DeployConfig, vpc: ec2.IVpc
    ) -> None:
        super().__init__(scope, construct_id)
        self.security_group = ec2.SecurityGroup(
            self,
            "SecurityGroup",
            vpc=vpc,
            description="spotgate limit store: reached by the gateways only",
            # The cache only answers connections; it opens none of its own.
            allow_all_outbound=False,
        )
        self.cache = elasticache.CfnServerlessCache(
            self,
            "Cache",
            engine=ENGINE,
            major_engine_version=MAJOR_ENGINE_VERSION,
            serverless_cache_name=cache_name(config.pool_name),
            description="spotgate gateways' per-key rate limits and failed-auth budgets",
            # The private subnets the gateways run in: no route reaches it from outside the VPC.
            subnet_ids=vpc.select_subnets(
                subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS
            ).subnet_ids,
            security_group_ids=[self.security_group.security_group_id],
            # No user group: the default user, no password. The gateway's client cannot use
            # IAM authentication, so the security group alone decides who connects; traffic
            # is always TLS.
            #
            # Limits are ceilings, not reservations: billing follows the data held and the
            # ECPUs used. The store holds small counters per API key and per client address
            # (far below 1 GB), and as many gateway tasks as autoscaling allows make some
            # hundreds of calls a second, a few ECPUs each; the caps bound what a runaway
            # client or a bug can cost. Past the ECPU cap calls are throttled (slow or
            # refused), which a gateway treats as an unreachable store: it falls back to its
            # own buckets.
            cache_usage_limits=elasticache.CfnServerlessCache.CacheUsageLimitsProperty(
                data_storage=elasticache.CfnServerlessCache.DataStorageProperty(
                    unit="GB", maximum=MAX_DATA_STORAGE_GB
                ),
                ecpu_per_second=elasticache.CfnServerlessCache.ECPUPerSecondProperty(
                    maximum=MAX_ECPU_PER_SECOND
                ),
            ),
        )
        # Counters that refill within minutes: nothing to snapshot or keep after the stack.
        self.cache.apply_removal_policy(RemovalPolicy.DESTROY)

    def allow_from(self, peer: ec2.ISecurityGroup) -> None:
        """Let `peer` (the gateways) reach the cache's port."""
        self.security_group.add_ingress_rule(
            peer, ec2.Port.tcp(PORT), "gateways keep shared rate limits here"
        )

    def environment(self) -> dict[str, str]:
        """The `SPOTGATE_GATEWAY_LIMIT_STORE__…` settings that point a gateway at the cache."""
        address, port = self.cache.attr_endpoint_address, self.cache.attr_endpoint_port
        return env_names(
            GatewaySettings,
            {
                # `rediss`: ElastiCache Serverless accepts TLS connections only.
                "limit_store.url": f"rediss://{address}:{port}/0",
                # A serverless endpoint is a cluster-mode endpoint: keys live in hash slots.
                "limit_store.cluster": "true",
            },
        )
