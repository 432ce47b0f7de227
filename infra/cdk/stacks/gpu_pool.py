"""The GPU agents' launch template: AMI, IMDSv2, encrypted root volume, boot script, role."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from aws_cdk import Annotations, Stack, Tags
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from constructs import Construct

from stacks.common import log_group, parameter_arn
from stacks.config import DeployConfig
from stacks.source import LOCKS, REPO_ROOT, agent_source

BOOT_SCRIPT = Path(__file__).with_name("agent_boot.sh")
PLACEHOLDER = re.compile(r"@@([A-Z_]+)@@")
AGENT_PORT = 8000
AGENT_DRAIN_GRACE_SECONDS = 90
"""The agent's drain on SIGTERM (its default; set here so systemd's timeout can exceed it)."""
SYSTEMD_STOP_MARGIN_SECONDS = 30
IMDS_HOP_LIMIT = 2
"""Two hops: a container on the instance can still reach IMDSv2 for the spot notice."""
CLOUDWATCH_AGENT_VERSION = "1.300072.0b1766"
CLOUDWATCH_AGENT_SHA256 = "05baeadca96c4bb8e43906ed09cf0bebd0f321ff6d41987bdc46ce681de0978d"
"""The CloudWatch agent the boot script installs (Ubuntu amd64 .deb), checked against this."""
BOOT_LOCK = REPO_ROOT / LOCKS / "boot.lock"
"""boto3, hash-pinned: what the boot script needs before it has the source and its locks."""
AGENT_REGISTRY_ACTIONS = ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:GetItem")
"""Register, heartbeat, drain, gone (conditional writes) and the read that explains a refusal."""
OWN_ROW_ONLY = {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["${ec2:SourceInstanceARN}"]}}
"""An agent registers under its instance's ARN (`spotgate.registry.instance_agent_id`), which
IAM names the instance a request comes from by: its role reaches that one row, no other."""


def render_boot_script(values: Mapping[str, str]) -> str:
    """The boot script with every @@NAME@@ replaced; a name left unfilled is an error."""
    script = BOOT_SCRIPT.read_text()
    for name, value in values.items():
        script = script.replace(f"@@{name}@@", value)
    left = sorted(set(PLACEHOLDER.findall(script)))
    if left:
        raise ValueError(f"{BOOT_SCRIPT.name}: placeholders left unfilled: {', '.join(left)}")
    return script


class GpuPool(Construct):
    """Everything an agent instance is launched with; the pool manager chooses type and zone."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: DeployConfig,
        vpc: ec2.IVpc,
        agents_table: dynamodb.ITable,
        shared_environment: Mapping[str, str],
        token_issuer: str,
    ) -> None:
        super().__init__(scope, construct_id)
        self.log_group = log_group(self, "Logs", config.log_retention_days)
        source = agent_source(self, "Source")

        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description="spotgate GPU agent: its own registry entry, its source, its logs",
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="OwnRegistryEntry",
                actions=list(AGENT_REGISTRY_ACTIONS),
                resources=[agents_table.table_arn],
                conditions=OWN_ROW_ONLY,
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="GatewayPublicKeys",
                actions=["ssm:GetParameter"],
                resources=[parameter_arn(self, config.jwks_parameter)],
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="SourceBundle",
                actions=["s3:GetObject"],
                resources=[source.bucket.arn_for_objects(source.s3_object_key)],
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="ShipLogs",
                actions=[
                    "logs:CreateLogStream",
                    "logs:PutLogEvents",
                    "logs:DescribeLogStreams",
                ],
                resources=[self.log_group.log_group_arn],
            )
        )

        self.security_group = ec2.SecurityGroup(
            self,
            "SecurityGroup",
            vpc=vpc,
            description="spotgate GPU agents: reached by the gateways only",
            # Model weights and Python packages come from the internet.
            allow_all_outbound=True,
        )

        settings = {
            **shared_environment,
            "SPOTGATE_LOG_FORMAT": "json",
            "SPOTGATE_AGENT_ENGINE": "vllm",
            "SPOTGATE_AGENT_MODEL": config.model,
            "SPOTGATE_AGENT_SERVED_MODEL_NAME": config.served_model,
            "SPOTGATE_AGENT_HOST": "0.0.0.0",  # noqa: S104 — reached by the gateways' tasks
            "SPOTGATE_AGENT_PORT": str(AGENT_PORT),
            # The gateways' public keys, read with this role: no path through the internet.
            "SPOTGATE_AGENT_JWKS_PARAMETER": config.jwks_parameter,
            "SPOTGATE_AGENT_TOKEN_ISSUER": token_issuer,
            "SPOTGATE_AGENT_DRAIN_GRACE_SECONDS": str(AGENT_DRAIN_GRACE_SECONDS),
            **(
                {"SPOTGATE_AGENT_VLLM__REVISION": config.model_revision}
                if config.model_revision
                else {}
            ),
            **dict(config.agent_settings),
        }
        if not config.model_revision and not config.model.startswith("/"):
            Annotations.of(self).add_warning_v2(
                "spotgate:unpinned-model",
                f"model {config.model} has no modelRevision: each new agent downloads the "
                "newest commit of its default branch, which may not be what was tested. Set "
                "modelRevision to the commit hash.",
            )
        self.agent_settings = settings
        self.boot_script = render_boot_script(
            {
                "REGION": config.region,
                "AGENT_PORT": str(AGENT_PORT),
                "LOG_GROUP": self.log_group.log_group_name,
                "SOURCE_BUCKET": source.s3_bucket_name,
                "SOURCE_KEY": source.s3_object_key,
                "AGENT_SETTINGS": "\n".join(f"{name}={value}" for name, value in settings.items()),
                "STOP_TIMEOUT_SECONDS": str(
                    AGENT_DRAIN_GRACE_SECONDS + SYSTEMD_STOP_MARGIN_SECONDS
                ),
                "CLOUDWATCH_AGENT_VERSION": CLOUDWATCH_AGENT_VERSION,
                "CLOUDWATCH_AGENT_SHA256": CLOUDWATCH_AGENT_SHA256,
                "BOOT_LOCK": BOOT_LOCK.read_text().strip(),
            }
        )

        self.launch_template = ec2.LaunchTemplate(
            self,
            "LaunchTemplate",
            launch_template_name=f"{config.pool_name}-agent",
            machine_image=ec2.MachineImage.from_ssm_parameter(config.ami_ssm_parameter),
            http_endpoint=True,
            http_tokens=ec2.LaunchTemplateHttpTokens.REQUIRED,
            http_put_response_hop_limit=IMDS_HOP_LIMIT,
            block_devices=[
                ec2.BlockDevice(
                    device_name=config.ami_root_device_name,
                    volume=ec2.BlockDeviceVolume.ebs(
                        config.root_volume_gib,
                        encrypted=True,
                        delete_on_termination=True,
                        volume_type=ec2.EbsDeviceVolumeType.GP3,
                    ),
                )
            ],
            role=self.role,
            security_group=self.security_group,
            user_data=ec2.UserData.custom(self.boot_script),
            # A shutdown from inside (or EC2 reclaiming a spot instance) ends the instance; the
            # pool manager replaces agents, it never restarts stopped ones.
            instance_initiated_shutdown_behavior=ec2.InstanceInitiatedShutdownBehavior.TERMINATE,
        )
        # The pool manager names each instance `<pool>-<model>`; the construct path is noise.
        Tags.of(self.launch_template).remove("Name")

    def allow_from(self, peer: ec2.ISecurityGroup) -> None:
        """Let `peer` (the gateways) reach the agents' port."""
        self.security_group.add_ingress_rule(
            peer, ec2.Port.tcp(AGENT_PORT), "gateways relay streams to agents"
        )

    @property
    def launch_template_id(self) -> str:
        """The `lt-…` id the pool manager launches from (`SPOTGATE_POOL_EC2__LAUNCH_TEMPLATE`)."""
        template_id = self.launch_template.launch_template_id
        if template_id is None:
            raise RuntimeError("the agents' launch template has no id")
        return template_id

    @property
    def launch_template_arn(self) -> str:
        """The template's ARN, for the pool manager's launch permissions."""
        return Stack.of(self).format_arn(
            service="ec2", resource="launch-template", resource_name=self.launch_template_id
        )
