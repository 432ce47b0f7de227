"""The pool manager on ECS Fargate: one task, EC2 launch rights limited to its own pool."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from aws_cdk import Duration, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from constructs import Construct

from pool_manager.ec2_provider import BOOT_TAG, POOL_TAG, STARTED_AT_TAG, STOPPED_AT_TAG
from spotgate.settings import PoolSettings, SharedSettings
from spotgate.settings_env_names import env_names
from stacks.common import (
    ECR_AUTH_REASON,
    acknowledge,
    acknowledge_wildcard_resource,
    log_group,
)
from stacks.config import DeployConfig
from stacks.gpu_pool import GpuPool
from stacks.registry import Registry
from stacks.spot_events import SpotEvents

POOL_CPU_UNITS = 256
POOL_MEMORY_MIB = 512
POOL_HEALTH_PORT = 8090
HEALTH_CHECK_INTERVAL_SECONDS = 30
HEALTH_CHECK_GRACE_SECONDS = 60
CONTAINER_HEALTH_COMMAND = (
    "import urllib.request; "
    f"urllib.request.urlopen('http://127.0.0.1:{POOL_HEALTH_PORT}/healthz', timeout=3)"
)
LAUNCH_ACTIONS = ("ec2:CreateFleet", "ec2:RunInstances")
WARM_POOL_ACTIONS = ("ec2:StopInstances", "ec2:StartInstances")
WARM_POOL_TAGS = (STOPPED_AT_TAG, STARTED_AT_TAG, BOOT_TAG)
DESCRIBE_ACTIONS = [
    "ec2:DescribeInstances",
    "ec2:DescribeSpotPriceHistory",
    "ec2:DescribeLaunchTemplates",
]
"""What the provider tags an instance of the pool with as it stops and starts it."""
# Launches create these alongside the instance; they cannot carry the pool's tag beforehand.
LAUNCH_SIDE_RESOURCES = ("volume", "network-interface", "spot-instances-request", "fleet")
SPOT_SERVICE_LINKED_ROLES = {
    "spot.amazonaws.com": "AWSServiceRoleForEC2Spot",
    "ec2fleet.amazonaws.com": "AWSServiceRoleForEC2Fleet",
}
"""EC2 creates these once per account, with the caller's rights, at the first spot launch."""


@dataclass(frozen=True)
class RegionalPool:
    """What the pool manager launches into in one region: its agents' templates and subnets."""

    region: str
    gpu_pool: GpuPool
    subnets: Sequence[ec2.ISubnet]
    home: bool = True

    @property
    def sid_suffix(self) -> str:
        """Names another region's statements apart (`UsWest2`); the home region's: none."""
        return "" if self.home else "".join(part.capitalize() for part in self.region.split("-"))


def placements_json(config: DeployConfig, zones: Sequence[str]) -> str:
    """`SPOTGATE_POOL_PLACEMENTS`: every instance type in every zone, with its prices."""
    return json.dumps(
        [
            {
                "instance_type": option.instance_type,
                "zone": zone,
                "spot_price_per_hour": option.spot_price_per_hour,
                "on_demand_price_per_hour": option.on_demand_price_per_hour,
            }
            for option in config.instance_types
            for zone in zones
        ]
    )


def pool_models_json(config: DeployConfig, templates: Mapping[str, str]) -> str:
    """`SPOTGATE_POOL_MODELS`: each model's bounds, warm pool, types and launch template."""
    return json.dumps(
        [
            {
                "name": model.name,
                "min_agents": model.min_agents,
                "max_agents": model.max_agents,
                **(
                    {"scale_to_zero_idle_seconds": model.scale_to_zero_idle_seconds}
                    if model.scale_to_zero_idle_seconds is not None
                    else {}
                ),
                "warm_pool_size": model.warm_pool_size,
                # What each of its stopped instances costs: its root volume.
                "volume_gib": config.root_volume_of(model),
                "instance_types": list(model.instance_types),
                "launch_template": templates[model.name],
            }
            for model in config.models
        ]
    )


class PoolManagerService(Construct):
    """`spotgate pool run` with the `ec2` provider, fed by the EC2 events queue."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: DeployConfig,
        vpc: ec2.IVpc,
        cluster: ecs.ICluster,
        image: ecs.ContainerImage,
        registry: Registry,
        spot_events: SpotEvents,
        pools: Sequence[RegionalPool],
    ) -> None:
        super().__init__(scope, construct_id)
        self.log_group = log_group(self, "Logs", config.log_retention_days)
        subnets = [subnet for pool in pools for subnet in pool.subnets]
        zones = [subnet.availability_zone for subnet in subnets]
        # A template's id is its region's: across regions the pool launches by name.
        templates = {
            model.name: config.launch_template_name(model)
            if config.pool_regions
            else pools[0].gpu_pool.launch_template_id(model.name)
            for model in config.models
        }
        regions = {"regions": json.dumps(config.all_regions)} if config.pool_regions else {}
        self.environment: dict[str, str] = {
            **registry.environment(config.region),
            **env_names(SharedSettings, {"log_format": "json"}),
            **env_names(
                PoolSettings,
                {
                    "provider": "ec2",
                    "port": str(POOL_HEALTH_PORT),
                    # Each model carries its own bounds and template, so the pool-wide ones
                    # (min_agents, max_agents, ec2.launch_template) would never be read.
                    "models": pool_models_json(config, templates),
                    **regions,
                    "spot_overprovision": str(config.spot_overprovision),
                    "on_demand_fallback": json.dumps(config.on_demand_fallback),
                    "launch_timeout_seconds": str(config.launch_timeout_seconds),
                    # A stopped instance costs its root volume (each model's own, above).
                    "volume_gib": str(config.root_volume_gib),
                    "interruption_queue_url": spot_events.queue.queue_url,
                    "placements": placements_json(config, zones),
                    "ec2.pool_name": config.pool_name,
                    # Agents go into the private subnets only: one per zone, in every region.
                    "ec2.subnets": json.dumps(
                        {subnet.availability_zone: subnet.subnet_id for subnet in subnets}
                    ),
                },
            ),
        }

        task = ecs.FargateTaskDefinition(
            self,
            "Task",
            cpu=POOL_CPU_UNITS,
            memory_limit_mib=POOL_MEMORY_MIB,
            runtime_platform=ecs.RuntimePlatform(
                cpu_architecture=ecs.CpuArchitecture.X86_64,
                operating_system_family=ecs.OperatingSystemFamily.LINUX,
            ),
        )
        task.add_container(
            "pool-manager",
            image=image,
            command=["pool", "run"],
            environment=self.environment,
            logging=ecs.LogDrivers.aws_logs(stream_prefix="pool-manager", log_group=self.log_group),
            health_check=ecs.HealthCheck(
                command=["CMD", "python", "-c", CONTAINER_HEALTH_COMMAND],
                interval=Duration.seconds(HEALTH_CHECK_INTERVAL_SECONDS),
                timeout=Duration.seconds(5),
                retries=3,
                start_period=Duration.seconds(HEALTH_CHECK_GRACE_SECONDS),
            ),
        )
        acknowledge(
            task,
            "AwsSolutions-ECS2",
            "The pool manager's settings are plain configuration; it reads no secret.",
        )
        self._grant(task.task_role, config, registry, spot_events, pools)
        acknowledge_wildcard_resource(task.obtain_execution_role(), "*", ECR_AUTH_REASON)

        self.service = ecs.FargateService(
            self,
            "Service",
            cluster=cluster,
            task_definition=task,
            desired_count=1,
            # Exactly one reconciler: a deploy stops the old task before starting the new one,
            # or two would launch for the same demand.
            min_healthy_percent=0,
            max_healthy_percent=100,
            circuit_breaker=ecs.DeploymentCircuitBreaker(rollback=True),
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            assign_public_ip=False,
        )

    @staticmethod
    def _grant(
        role: iam.IRole,
        config: DeployConfig,
        registry: Registry,
        spot_events: SpotEvents,
        pools: Sequence[RegionalPool],
    ) -> None:
        stack = Stack.of(role)
        statements = [
            *(statement for pool in pools for statement in launch_statements(stack, config, pool)),
            *lifecycle_statements(stack, config),
            *role_statements(stack, pools),
            *queue_and_registry_statements(registry, spot_events),
        ]
        for statement in statements:
            role.add_to_principal_policy(statement)
        for region in config.all_regions:
            acknowledge_wildcards(role, region)


def ec2_arn(
    stack: Stack,
    resource: str,
    name: str = "*",
    account: str | None = None,
    region: str | None = None,
) -> str:
    """The ARN of EC2's `resource` called `name` (all of them: `*`) in `region` (the stack's)."""
    return stack.format_arn(
        service="ec2", region=region, resource=resource, resource_name=name, account=account
    )


def launch_statements(
    stack: Stack, config: DeployConfig, pool: RegionalPool
) -> list[iam.PolicyStatement]:
    """Launch the pool's instances in `pool`'s region from its templates; tag them at launch."""
    gpu_pool, subnets, region, sid = pool.gpu_pool, pool.subnets, pool.region, pool.sid_suffix

    def arn(resource: str, name: str = "*", account: str | None = None) -> str:
        return ec2_arn(stack, resource, name, account, region)

    return [
        # An instance of the pool, from one of the models' launch templates, of a configured
        # type: the role cannot start anything else (another AMI, another size).
        iam.PolicyStatement(
            sid=f"LaunchPoolInstances{sid}",
            actions=list(LAUNCH_ACTIONS),
            resources=[arn("instance")],
            conditions={
                "StringEquals": {
                    f"aws:RequestTag/{POOL_TAG}": config.pool_name,
                    "ec2:InstanceType": [option.instance_type for option in config.instance_types],
                },
                "ArnLike": {"ec2:LaunchTemplate": gpu_pool.launch_template_arns},
            },
        ),
        iam.PolicyStatement(
            sid=f"LaunchFromAgentTemplate{sid}",
            actions=list(LAUNCH_ACTIONS),
            resources=[
                *gpu_pool.launch_template_arns,
                arn("security-group", gpu_pool.security_group.security_group_id),
                *(arn("subnet", subnet.subnet_id) for subnet in subnets),
                *(arn(resource) for resource in LAUNCH_SIDE_RESOURCES),
            ],
        ),
        # The AMI the template names, never one passed with the call.
        iam.PolicyStatement(
            sid=f"TemplateImageOnly{sid}",
            actions=list(LAUNCH_ACTIONS),
            resources=[arn("image", account="")],
            conditions={"Bool": {"ec2:IsLaunchTemplateResource": "true"}},
        ),
        iam.PolicyStatement(
            sid=f"TagAtLaunchOnly{sid}",
            actions=["ec2:CreateTags"],
            resources=[arn("instance"), arn("volume"), arn("fleet")],
            conditions={"StringEquals": {"ec2:CreateAction": ["CreateFleet", "RunInstances"]}},
        ),
    ]


def lifecycle_statements(stack: Stack, config: DeployConfig) -> list[iam.PolicyStatement]:
    """Terminate, stop, start and tag the pool's own instances; list instances and prices."""
    instances = [ec2_arn(stack, "instance", region=region) for region in config.all_regions]
    return [
        iam.PolicyStatement(
            sid="TerminatePoolInstances",
            actions=["ec2:TerminateInstances"],
            resources=instances,
            conditions={"StringEquals": {f"aws:ResourceTag/{POOL_TAG}": config.pool_name}},
        ),
        # Stop into the warm pool and start from it: the pool's own instances only (EC2
        # itself refuses to stop a spot one).
        iam.PolicyStatement(
            sid="StopStartPoolInstances",
            actions=list(WARM_POOL_ACTIONS),
            resources=instances,
            conditions={"StringEquals": {f"aws:ResourceTag/{POOL_TAG}": config.pool_name}},
        ),
        # The stop and start times and the boot's kind, on the pool's instances: no other
        # key, so the pool and model tags a launch set stay as they are.
        iam.PolicyStatement(
            sid="TagWarmPoolInstances",
            actions=["ec2:CreateTags"],
            resources=instances,
            conditions={
                "StringEquals": {f"aws:ResourceTag/{POOL_TAG}": config.pool_name},
                "ForAllValues:StringEquals": {"aws:TagKeys": list(WARM_POOL_TAGS)},
            },
        ),
        # The Describe calls have no resource-level permissions in IAM; the provider filters
        # on the pool's tag itself, reads the prices of its own placements, and the
        # latest version of its own launch templates (a warm instance of an older one is
        # stale).
        iam.PolicyStatement(
            sid="ListInstances",
            actions=DESCRIBE_ACTIONS,
            resources=["*"],
        ),
    ]


def role_statements(stack: Stack, pools: Sequence[RegionalPool]) -> list[iam.PolicyStatement]:
    """Hand the agents' roles to their instances; create spot's service-linked roles once."""
    return [
        iam.PolicyStatement(
            sid="PassAgentRole",
            actions=["iam:PassRole"],
            resources=[pool.gpu_pool.role.role_arn for pool in pools],
            conditions={"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}},
        ),
        iam.PolicyStatement(
            sid="SpotServiceLinkedRoles",
            actions=["iam:CreateServiceLinkedRole"],
            resources=[
                stack.format_arn(
                    service="iam",
                    region="",
                    resource="role",
                    resource_name=f"aws-service-role/{service}/{name}",
                )
                for service, name in SPOT_SERVICE_LINKED_ROLES.items()
            ],
            conditions={"StringEquals": {"iam:AWSServiceName": list(SPOT_SERVICE_LINKED_ROLES)}},
        ),
    ]


def queue_and_registry_statements(
    registry: Registry, spot_events: SpotEvents
) -> list[iam.PolicyStatement]:
    """Read the EC2 events queue; the registry tables the pool manager reads and writes."""
    return [
        iam.PolicyStatement(
            sid="ConsumeEc2Events",
            actions=["sqs:ReceiveMessage", "sqs:DeleteMessage"],
            resources=[spot_events.queue.queue_arn],
        ),
        iam.PolicyStatement(
            # Read, drain, mark gone; delete a gone entry before a warm start (conditional).
            sid="ManageAgentEntries",
            actions=[
                "dynamodb:Scan",
                "dynamodb:GetItem",
                "dynamodb:UpdateItem",
                "dynamodb:DeleteItem",
            ],
            resources=[registry.agents.table_arn],
        ),
        iam.PolicyStatement(
            # What it launched, the only writer: re-written for the instances it finds.
            sid="VouchForLaunches",
            actions=["dynamodb:PutItem", "dynamodb:DeleteItem"],
            resources=[registry.launches.table_arn],
        ),
        iam.PolicyStatement(
            # Demand and fixed targets in; its forecasts for the gateways out.
            sid="ReadDemandWriteForecasts",
            actions=["dynamodb:Scan", "dynamodb:PutItem", "dynamodb:DeleteItem"],
            resources=[registry.demand.table_arn],
        ),
    ]


def acknowledge_wildcards(role: iam.IRole, region: str) -> None:
    """Acknowledge, with its reason, each wildcard resource the role needs in `region`."""
    # cdk-nag names each wildcard resource as it prints ARNs, pseudo parameters in <>.
    prefix = f"arn:<AWS::Partition>:ec2:{region}"
    mine = f"{prefix}:<AWS::AccountId>"
    wildcards = {
        "*": f"{', '.join(DESCRIBE_ACTIONS)} have no resource-level permissions in IAM.",
        f"{mine}:instance/*": "Launch, terminate, stop, start and tagging are bound by the "
        "spotgate:pool request/resource tag; instance ids are unknown before launch.",
        f"{mine}:volume/*": "The root volume is created by the launch.",
        f"{mine}:network-interface/*": "The launch creates the interface.",
        f"{mine}:spot-instances-request/*": "A spot launch makes its request.",
        f"{mine}:fleet/*": "Each instant fleet is created by the launch.",
        f"{prefix}::image/*": "The AMI comes from an overridable SSM parameter.",
    }
    for resource, reason in wildcards.items():
        acknowledge_wildcard_resource(role, resource, reason)
