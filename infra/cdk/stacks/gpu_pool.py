"""The GPU agents: their image, their models' bucket, their launch template and role."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import cast

from aws_cdk import Annotations, CfnElement, RemovalPolicy, Stack, Tags
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from spotgate.model_store import S3_SCHEME, is_s3_uri, split_s3_uri
from spotgate.settings import AgentSettings, SharedSettings
from spotgate.settings_env_names import env_name, env_names
from stacks.common import (
    ECR_AUTH_REASON,
    acknowledge,
    acknowledge_wildcard_resource,
    log_group,
    parameter_arn,
)
from stacks.config import DeployConfig, ModelConfig
from stacks.source import agent_image

BOOT_SCRIPT = Path(__file__).with_name("agent_boot.sh")
LORA_ADAPTERS_SETTING = env_name(AgentSettings, "vllm.lora_adapters")
PLACEHOLDER = re.compile(r"@@([A-Z_]+)@@")
AGENT_PORT = 8000
AGENT_DRAIN_GRACE_SECONDS = 90
"""The agent's drain on SIGTERM (its default; set here so systemd's timeout can exceed it)."""
DOCKER_STOP_MARGIN_SECONDS = 30
"""Past the drain, before Docker kills the agent; systemd waits as much again for Docker."""
IMDS_HOP_LIMIT = 2
"""Two hops: a container on the instance can still reach IMDSv2 for the spot notice."""
AGENT_CACHE_DIR = "/var/cache/spotgate"
"""Inside the agent's container: where staged models are fetched, Hugging Face downloads and
vLLM's caches go (the boot script mounts instance storage or a root volume directory there)."""
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


def boot_script(
    config: DeployConfig,
    model: ModelConfig,
    settings: Mapping[str, str],
    image_uri: str,
    log_group_name: str,
) -> str:
    """The boot script of `model`'s agents: it writes `settings` and runs `image_uri`."""
    drain_stop_seconds = AGENT_DRAIN_GRACE_SECONDS + DOCKER_STOP_MARGIN_SECONDS
    return render_boot_script(
        {
            "REGION": config.region,
            "AGENT_PORT": str(AGENT_PORT),
            "AGENT_IMAGE": image_uri,
            "LOG_GROUP": log_group_name,
            "AGENT_SETTINGS": "\n".join(f"{k}={v}" for k, v in settings.items()),
            "KEEP_CACHE_ON_STOP": "true" if model.keeps_cache_on_stop else "false",
            "DRAIN_STOP_SECONDS": str(drain_stop_seconds),
            "STOP_TIMEOUT_SECONDS": str(drain_stop_seconds + DOCKER_STOP_MARGIN_SECONDS),
        }
    )


def is_pinned_copy(model: str) -> bool:
    """Whether `model` names a fixed copy (a path on the AMI, a staged prefix): no revision."""
    return model.startswith("/") or is_s3_uri(model)


def pool_agent_settings(
    config: DeployConfig, shared_environment: Mapping[str, str], token_issuer: str
) -> dict[str, str]:
    """The settings every model's agents share: the registry's, their listener, their keys."""
    return {
        **shared_environment,
        **env_names(SharedSettings, {"log_format": "json"}),
        **env_names(
            AgentSettings,
            {
                "engine": "vllm",
                "model_cache_dir": AGENT_CACHE_DIR,
                "host": "0.0.0.0",  # noqa: S104 — reached by the gateways' tasks
                "port": str(AGENT_PORT),
                # The gateways' public keys, read with this role: no path through the internet.
                "jwks_parameter": config.jwks_parameter,
                "token_issuer": token_issuer,
                "drain_grace_seconds": str(AGENT_DRAIN_GRACE_SECONDS),
            },
        ),
        # agentSettings cannot set what a model sets (validated): the order is free.
        **dict(config.agent_settings),
    }


def agent_settings(pool_settings: Mapping[str, str], model: ModelConfig) -> dict[str, str]:
    """The settings of `model`'s agents: the pool's, then the model's, its agentSettings last."""
    vllm = {
        "vllm.tensor_parallel_size": str(model.tensor_parallel_size),
        "vllm.revision": model.revision,
        "vllm.engine_args": model.engine_args,
        "vllm.tool_call_parser": model.tool_call_parser,
        "vllm.reasoning_parser": model.reasoning_parser,
        "vllm.chat_template": model.chat_template,
    }
    return {
        **pool_settings,
        **env_names(
            AgentSettings,
            {
                "model": model.model,
                "served_model_name": model.name,
                "model_fetch": model.fetch,
                # Unset ones are left to the agent's defaults (an empty value is not "none" to
                # it).
                **{field_path: value for field_path, value in vllm.items() if value},
            },
        ),
        **dict(model.agent_settings),
    }


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
        self.config = config
        self.log_group = log_group(self, "Logs", config.log_retention_days)
        self.image_uri, image_repository = agent_image(self, "Image", config)
        self.model_bucket = self._model_bucket()
        self.role = self._role(config, agents_table, image_repository)
        self.security_group = ec2.SecurityGroup(
            self,
            "SecurityGroup",
            vpc=vpc,
            description="spotgate GPU agents: reached by the gateways only",
            # A model from the Hugging Face Hub comes from the internet.
            allow_all_outbound=True,
        )
        pool_settings = pool_agent_settings(config, shared_environment, token_issuer)
        if self.is_remote:  # its registry is at home, its staged model in its own region
            region = Stack.of(self).region
            pool_settings |= env_names(AgentSettings, {"model_region": region})
        # One profile for every template: a template given the role alone would make its own.
        instance_profile = iam.InstanceProfile(self, "InstanceProfile", role=self.role)
        machine_image = ec2.MachineImage.from_ssm_parameter(config.ami_ssm_parameter)
        self.agent_settings: dict[str, dict[str, str]] = {}
        self.boot_scripts: dict[str, str] = {}
        self.launch_templates: dict[str, ec2.LaunchTemplate] = {}
        for model in config.models:
            if not model.revision and not is_pinned_copy(model.model):
                Annotations.of(self).add_warning_v2(
                    "spotgate:unpinned-model",
                    f"model {model.name} ({model.model}) has no revision: each new agent "
                    "downloads the newest commit of its default branch, which may not be what "
                    "was tested. Set its revision to the commit hash.",
                )
            settings = self._own_adapters(agent_settings(pool_settings, self._own_copy(model)))
            boot_script = self._boot_script(config, model, settings)
            template = ec2.LaunchTemplate(
                self,
                f"LaunchTemplate-{model.safe_name}",
                launch_template_name=config.launch_template_name(model),
                machine_image=machine_image,
                http_endpoint=True,
                http_tokens=ec2.LaunchTemplateHttpTokens.REQUIRED,
                http_put_response_hop_limit=IMDS_HOP_LIMIT,
                block_devices=[
                    ec2.BlockDevice(
                        device_name=config.ami_root_device_name,
                        volume=ec2.BlockDeviceVolume.ebs(
                            config.root_volume_of(model),
                            encrypted=True,
                            delete_on_termination=True,
                            volume_type=ec2.EbsDeviceVolumeType.GP3,
                        ),
                    )
                ],
                instance_profile=instance_profile,
                security_group=self.security_group,
                # The model is the template's, never the image's: one image serves every model.
                user_data=ec2.UserData.custom(boot_script),
                # A shutdown from inside ends the instance (a reclaimed spot one ends anyway);
                # only the pool manager stops one, into its model's warm pool, with the EC2 API.
                instance_initiated_shutdown_behavior=(
                    ec2.InstanceInitiatedShutdownBehavior.TERMINATE
                ),
            )
            # The pool manager names each instance `<pool>-<model>`; the construct path is noise.
            Tags.of(template).remove("Name")
            self.agent_settings[model.name] = settings
            self.boot_scripts[model.name] = boot_script
            self.launch_templates[model.name] = template

    @property
    def is_remote(self) -> bool:
        """Whether it is in another region than the home one (the gateways', the registry's)."""
        return Stack.of(self).region != self.config.region

    def _own_copy(self, model: ModelConfig) -> ModelConfig:
        """`model` with a staged copy read from this region's bucket: weights never cross one.

        `spotgate model stage` copies a model to every region's bucket, under one prefix.
        """
        return replace(model, model=self._own_uri(model.model))

    def _own_adapters(self, settings: Mapping[str, str]) -> dict[str, str]:
        """`settings` with each staged LoRA adapter read from this region's bucket too."""
        named = {name.upper(): name for name in settings}
        key = named.get(LORA_ADAPTERS_SETTING)
        if key is None or not self.is_remote:
            return dict(settings)
        adapters = json.loads(settings[key])
        own = {name: self._own_uri(uri) for name, uri in adapters.items()}
        return {**settings, key: json.dumps(own)}

    def _own_uri(self, uri: str) -> str:
        """A staged copy's URI in this region's bucket (the same prefix); others as they are."""
        if not is_s3_uri(uri) or not self.is_remote:
            return uri
        _bucket, prefix = split_s3_uri(uri)
        return f"{S3_SCHEME}{self.model_bucket.bucket_name}/{prefix}"

    def _model_bucket(self) -> s3.Bucket:
        bucket = s3.Bucket(
            self,
            "Models",
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            # Staged copies of models: `spotgate model stage` writes them again if lost.
            removal_policy=RemovalPolicy.RETAIN,
        )
        acknowledge(
            bucket,
            "AwsSolutions-S1",
            "Model copies read by the agents' role only; CloudTrail data events log reads "
            "where an audit needs them.",
        )
        return bucket

    def _role(
        self,
        config: DeployConfig,
        agents_table: dynamodb.ITable,
        image_repository: ecr.IRepository,
    ) -> iam.Role:
        """The agents' role: their own registry entry, their image, models, keys and logs."""
        role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description="spotgate GPU agent: its own registry entry, its image, models, logs",
        )
        image_repository.grant_pull(role)
        acknowledge_wildcard_resource(role, "*", ECR_AUTH_REASON)
        role.add_to_policy(
            iam.PolicyStatement(
                sid="StagedModels",
                actions=["s3:GetObject", "s3:ListBucket"],  # the streamer lists, then reads
                resources=[self.model_bucket.bucket_arn, self.model_bucket.arn_for_objects("*")],
            )
        )
        bucket = self.model_bucket.node.default_child  # a bucket's is its CfnBucket
        acknowledge_wildcard_resource(
            role,
            f"<{Stack.of(self).get_logical_id(cast(CfnElement, bucket))}.Arn>/*",
            "Any staged model in the pool's own bucket: the model is a setting.",
        )
        role.add_to_policy(
            iam.PolicyStatement(
                sid="OwnRegistryEntry",
                actions=list(AGENT_REGISTRY_ACTIONS),
                resources=[agents_table.table_arn],
                conditions=OWN_ROW_ONLY,
            )
        )
        role.add_to_policy(
            iam.PolicyStatement(
                sid="GatewayPublicKeys",
                actions=["ssm:GetParameter"],
                # The gateways publish them in the home region, wherever the agent runs.
                resources=[parameter_arn(self, config.jwks_parameter, config.region)],
            )
        )
        role.add_to_policy(
            iam.PolicyStatement(
                sid="ShipLogs",
                actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[self.log_group.log_group_arn],
            )
        )
        return role

    def _boot_script(
        self, config: DeployConfig, model: ModelConfig, settings: Mapping[str, str]
    ) -> str:
        """The boot script of `model`'s agents, which writes `settings` to their settings file."""
        return boot_script(config, model, settings, self.image_uri, self.log_group.log_group_name)

    def allow_from(self, peer: ec2.IPeer) -> None:
        """Let `peer` (the gateways, or the home VPC's network) reach the agents' port."""
        self.security_group.add_ingress_rule(
            peer, ec2.Port.tcp(AGENT_PORT), "gateways relay streams to agents"
        )

    def launch_template_id(self, model: str) -> str:
        """The `lt-…` id the pool manager launches `model`'s agents from."""
        template_id = self.launch_templates[model].launch_template_id
        if template_id is None:
            raise RuntimeError(f"the launch template of {model} has no id")
        return template_id

    @property
    def launch_template_arns(self) -> list[str]:
        """Every model's template ARN, for the pool manager's launch permissions."""
        return [
            Stack.of(self).format_arn(
                service="ec2",
                resource="launch-template",
                resource_name=self.launch_template_id(name),
            )
            for name in self.launch_templates
        ]
