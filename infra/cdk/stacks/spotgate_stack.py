"""The one stack: network, tables, limit store, events, GPU pool, gateway, pool manager, alarms."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aws_cdk import CfnOutput, Environment, Stack
from aws_cdk import aws_ecs as ecs
from constructs import Construct

from spotgate.settings import PoolSettings, SharedSettings
from spotgate.settings_env_names import env_name
from stacks.config import DeployConfig
from stacks.gateway_service import GatewayService
from stacks.gpu_pool import GpuPool
from stacks.limit_store import LimitStore
from stacks.monitoring import Monitoring
from stacks.network import Network
from stacks.pool_manager_service import PoolManagerService, RegionalPool
from stacks.pool_region import PoolRegionStack, RegionPeering
from stacks.registry import Registry
from stacks.signing_key import SigningKey
from stacks.source import service_image
from stacks.spot_events import SpotEvents


class SpotgateStack(Stack):
    """spotgate in one AWS account and region, as `cdk deploy` stands it up."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: DeployConfig,
        pool_regions: Sequence[PoolRegionStack] = (),
        **kwargs: Any,
    ) -> None:
        # The region is fixed by the settings; the account is whichever the CLI deploys into.
        super().__init__(
            scope,
            construct_id,
            env=Environment(region=config.region),
            cross_region_references=bool(pool_regions),
            **kwargs,
        )
        self.config = config
        self.network = Network(
            self, "Network", config=config, cidr=config.vpc_cidr, zones=config.availability_zones
        )
        vpc = self.network.vpc
        self.peerings = [
            RegionPeering(
                self, f"Peering-{remote.pool_region.region}", home=self.network, remote=remote
            )
            for remote in pool_regions
        ]
        self.registry = Registry(self, "Registry", config=config)
        self.limit_store = LimitStore(self, "LimitStore", config=config, vpc=vpc)
        self.spot_events = SpotEvents(self, "SpotEvents")
        self.signing_key = SigningKey(
            self, "SigningKey", log_retention_days=config.log_retention_days
        )
        self.cluster = cluster = ecs.Cluster(
            self, "Cluster", vpc=vpc, container_insights_v2=ecs.ContainerInsights.ENABLED
        )
        image = service_image(config)
        self.gateway = GatewayService(
            self,
            "Gateway",
            config=config,
            vpc=vpc,
            cluster=cluster,
            image=image,
            registry=self.registry,
            signing_key=self.signing_key,
            limit_store=self.limit_store,
        )
        # Only the gateways use the store: the pool manager and the agents cannot reach it.
        self.limit_store.allow_from(self.gateway.security_group)
        self.gpu_pool = GpuPool(
            self,
            "GpuPool",
            config=config,
            vpc=vpc,
            agents_table=self.registry.agents,
            shared_environment=self.registry.environment(config.region),
            token_issuer=self.gateway.public_url,
        )
        self.gpu_pool.allow_from(self.gateway.security_group)
        self.pool_manager = PoolManagerService(
            self,
            "PoolManager",
            config=config,
            vpc=vpc,
            cluster=cluster,
            image=image,
            registry=self.registry,
            spot_events=self.spot_events,
            pools=[
                RegionalPool(config.region, self.gpu_pool, vpc.private_subnets),
                *(
                    RegionalPool(
                        remote.pool_region.region,
                        remote.gpu_pool,
                        remote.network.vpc.private_subnets,
                        home=False,
                    )
                    for remote in pool_regions
                ),
            ],
        )
        self.monitoring = Monitoring(
            self,
            "Monitoring",
            config=config,
            agents_table=self.registry.agents,
            demand_table=self.registry.demand,
            pool_manager_logs=self.pool_manager.log_group,
            events_queue=self.spot_events.queue,
            dead_letters=self.spot_events.dead_letters,
        )
        self._outputs()

    def _outputs(self) -> None:
        registry, gateway = self.registry, self.gateway
        outputs = {
            "GatewayUrl": (gateway.public_url, "The gateway's base URL (OpenAI base_url: +/v1)"),
            "ChatUrl": (f"{gateway.public_url}/", "The browser chat page"),
            "LoadBalancerDns": (
                gateway.load_balancer.load_balancer_dns_name,
                "Point gatewayDomain's DNS record (CNAME or alias) here",
            ),
            "AgentsTable": (registry.agents.table_name, env_name(SharedSettings, "tables.agents")),
            "KeysTable": (registry.keys.table_name, env_name(SharedSettings, "tables.keys")),
            "DemandTable": (registry.demand.table_name, env_name(SharedSettings, "tables.demand")),
            "InterruptionQueueUrl": (
                self.spot_events.queue.queue_url,
                env_name(PoolSettings, "interruption_queue_url"),
            ),
            "ClusterName": (self.cluster.cluster_name, "The ECS cluster of both services"),
            "PoolManagerService": (
                self.pool_manager.service.service_name,
                "Scale it to 0 before tearing down, so no agent is launched meanwhile",
            ),
            "AgentLogGroup": (
                self.gpu_pool.log_group.log_group_name,
                "Agents' logs (<instance>/agent); a failed boot: the instance's console output",
            ),
            "ModelBucket": (
                self.gpu_pool.model_bucket.bucket_name,
                "Where `spotgate model stage DIR --bucket <this>` copies a model for the agents",
            ),
            "AgentImage": (
                self.gpu_pool.image_uri,
                "The GPU agents' image (vLLM and spotgate), pulled by every agent at boot",
            ),
            "AccessLogsBucket": (
                gateway.access_logs.bucket_name,
                "The load balancer's and the files bucket's access logs (kept after cdk destroy)",
            ),
            "CreateKeyCommand": (
                " ".join(
                    f"{name}={value}" for name, value in registry.environment(self.region).items()
                )
                + " spotgate keys create --name first",
                "Creates the first API key (run where spotgate is installed, with AWS credentials)",
            ),
        }
        for name, (value, description) in outputs.items():
            CfnOutput(self, name, value=value, description=description)
