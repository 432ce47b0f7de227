"""The VPC: public subnets for the load balancer and NAT, private ones for everything else."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from stacks.common import log_group
from stacks.config import DeployConfig

PUBLIC_SUBNET_MASK_BITS = 24
PRIVATE_SUBNET_MASK_BITS = 20
"""Private subnets are larger: every agent and Fargate task takes an address there."""


class Network(Construct):
    """VPC across at least two zones, with flow logs and free gateway endpoints."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: DeployConfig,
        cidr: str,
        zones: Sequence[str] = (),
    ) -> None:
        super().__init__(scope, construct_id)
        self.cidr = cidr
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(cidr),
            availability_zones=list(zones) or None,
            max_azs=None if zones else config.max_azs,
            nat_gateways=config.nat_gateways,
            subnet_configuration=[
                ec2.SubnetConfiguration(
                    name="public",
                    subnet_type=ec2.SubnetType.PUBLIC,
                    cidr_mask=PUBLIC_SUBNET_MASK_BITS,
                ),
                ec2.SubnetConfiguration(
                    name="private",
                    subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS,
                    cidr_mask=PRIVATE_SUBNET_MASK_BITS,
                ),
            ],
        )
        # DynamoDB and S3 (the agents' source bundle, model mirrors) stay off the NAT gateway:
        # gateway endpoints cost nothing and NAT charges per gigabyte.
        self.vpc.add_gateway_endpoint("DynamoDb", service=ec2.GatewayVpcEndpointAwsService.DYNAMODB)
        self.vpc.add_gateway_endpoint("S3", service=ec2.GatewayVpcEndpointAwsService.S3)

        self.flow_log_group = log_group(self, "FlowLogs", config.log_retention_days)
        self.vpc.add_flow_log(
            "FlowLog",
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(self.flow_log_group),
            traffic_type=ec2.FlowLogTrafficType.ALL,
        )

    @property
    def private_subnets(self) -> list[ec2.ISubnet]:
        """Where agents, gateways and the pool manager run."""
        return list(self.vpc.private_subnets)
