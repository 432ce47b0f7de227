"""The pool's other regions: a stack each for its agents, the peering, and the routes back.

Agents in another region serve the home region's gateways over VPC peering (the home VPC's
network admitted to their port), register in the home region's tables, read the gateways'
keys there, and read a model from their own region's bucket. EC2's events of the region are
forwarded to the home region's default event bus, where the pool manager's rule takes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aws_cdk import CfnOutput, Environment, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from constructs import Construct

from stacks.config import DeployConfig, PoolRegionConfig
from stacks.gpu_pool import GpuPool
from stacks.network import Network
from stacks.registry import home_registry_environment, table_name
from stacks.spot_events import event_pattern


class PoolRegionStack(Stack):
    """A region of the pool other than the home one: VPC, agents' templates, role, bucket."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: DeployConfig,
        pool_region: PoolRegionConfig,
        token_issuer: str,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            scope,
            construct_id,
            env=Environment(region=pool_region.region),
            cross_region_references=True,
            **kwargs,
        )
        self.pool_region = pool_region
        self.home_region = config.region
        self.network = Network(
            self,
            "Network",
            config=config,
            cidr=pool_region.vpc_cidr,
            zones=pool_region.availability_zones,
        )
        agents_table = dynamodb.Table.from_table_arn(
            self, "HomeAgents", self._home_arn("dynamodb", "table", table_name(config, "agents"))
        )
        self.gpu_pool = GpuPool(
            self,
            "GpuPool",
            config=config,
            vpc=self.network.vpc,
            agents_table=agents_table,
            shared_environment=home_registry_environment(config),
            token_issuer=token_issuer,
        )
        # The gateways run in the home VPC: a security group there cannot be named here.
        self.gpu_pool.allow_from(ec2.Peer.ipv4(config.vpc_cidr))
        home_bus = events.EventBus.from_event_bus_arn(
            self, "HomeEventBus", self._home_arn("events", "event-bus", "default")
        )
        events.Rule(
            self,
            "ForwardEc2Events",
            description="EC2 spot and instance events of this region, to the pool manager's",
            event_pattern=event_pattern(),
            targets=[targets.EventBus(home_bus)],
        )
        CfnOutput(
            self,
            "ModelBucket",
            value=self.gpu_pool.model_bucket.bucket_name,
            description=f"Where `spotgate model stage` copies a model for the agents in "
            f"{pool_region.region} (one more --bucket)",
        )

    def _home_arn(self, service: str, resource: str, name: str) -> str:
        """The ARN of a resource of the home region, in this account."""
        return self.format_arn(
            service=service, region=self.home_region, resource=resource, resource_name=name
        )


class RegionPeering(Construct):
    """The home VPC peered with a pool region's, and the home side's routes to it."""

    def __init__(
        self, scope: Construct, construct_id: str, *, home: Network, remote: PoolRegionStack
    ) -> None:
        super().__init__(scope, construct_id)
        self.connection = ec2.CfnVPCPeeringConnection(
            self,
            "Connection",
            vpc_id=home.vpc.vpc_id,
            peer_vpc_id=remote.network.vpc.vpc_id,
            peer_region=remote.pool_region.region,
        )
        add_routes(self, home.vpc.private_subnets, remote.network.cidr, self.connection.ref)


class PoolRegionRoutesStack(Stack):
    """A pool region's routes back to the home VPC, once the peering (made at home) exists."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: DeployConfig,
        remote: PoolRegionStack,
        peering: RegionPeering,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            scope,
            construct_id,
            env=Environment(region=remote.pool_region.region),
            cross_region_references=True,
            **kwargs,
        )
        add_routes(
            self, remote.network.vpc.private_subnets, config.vpc_cidr, peering.connection.ref
        )


def add_routes(
    scope: Construct, subnets: Sequence[ec2.ISubnet], cidr: str, peering_id: str
) -> None:
    """A route from each of `subnets` to `cidr` over the peering connection."""
    for index, subnet in enumerate(subnets):
        ec2.CfnRoute(
            scope,
            f"ToPeer{index}",
            route_table_id=subnet.route_table.route_table_id,
            destination_cidr_block=cidr,
            vpc_peering_connection_id=peering_id,
        )
