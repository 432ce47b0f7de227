"""The gateway on ECS Fargate behind an internet-facing Application Load Balancer."""

from __future__ import annotations

import json
from typing import cast

from aws_cdk import Annotations, CfnElement, Duration, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from spotgate.registry import BY_CHANGE_INDEX, BY_WORK_INDEX
from spotgate.settings import GatewaySettings, SharedSettings
from spotgate.settings_env_names import env_name, env_names
from stacks.common import (
    ECR_AUTH_REASON,
    acknowledge,
    acknowledge_wildcard_resource,
    log_group,
    parameter_arn,
)
from stacks.config import DeployConfig
from stacks.limit_store import LimitStore
from stacks.registry import Registry
from stacks.signing_key import SigningKey

GATEWAY_PORT = 8080
OPS_PORT = 9090
"""`/readyz` and `/metrics`: a listener of its own, which the load balancer never forwards."""
HEALTH_PATH = "/healthz"
"""Liveness, not `/readyz`: a registry outage must not take every gateway out of the ALB."""
HEALTH_CHECK_INTERVAL_SECONDS = 15
HEALTH_CHECK_GRACE_SECONDS = 60
CPU_TARGET_PERCENT = 60
SCALE_OUT_COOLDOWN_SECONDS = 60
SCALE_IN_COOLDOWN_SECONDS = 300
ACCESS_LOG_DAYS = 90
SIGNING_KEY_ENV = env_name(GatewaySettings, "token.signing_key_pem")
KEEPALIVE_MARGIN_SECONDS = 60
S3_ACCESS_LOGS_BY_POLICY = "@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy"
"""The CDK feature flag by which S3 delivers access logs under the log bucket's policy, not its
ACL: the log bucket disables ACLs (BUCKET_OWNER_ENFORCED)."""
CONTAINER_HEALTH_COMMAND = (
    "import urllib.request; "
    f"urllib.request.urlopen('http://127.0.0.1:{OPS_PORT}{HEALTH_PATH}', timeout=3)"
)
"""The container's own check reads the operations listener; the load balancer's, traffic."""


class GatewayService(Construct):
    """Gateways in private subnets; the ALB holds websockets open for `albIdleTimeoutSeconds`."""

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
        signing_key: SigningKey,
        limit_store: LimitStore,
    ) -> None:
        super().__init__(scope, construct_id)
        # Set before any child is made: a construct's context is read-only after.
        self.node.set_context(S3_ACCESS_LOGS_BY_POLICY, True)
        self.log_group = log_group(self, "Logs", config.log_retention_days)
        self.access_logs = self._access_logs()
        self.files = self._files()
        self.load_balancer = self._load_balancer(config, vpc)
        host = config.gateway_domain or self.load_balancer.load_balancer_dns_name
        self.public_url = config.gateway_url(host)
        self.environment: dict[str, str] = {
            **registry.environment(config.region),
            # Every replica admits against the same counters: a key's limits do not multiply
            # with the tasks autoscaling adds.
            **limit_store.environment(),
            **self._own_environment(config, vpc),
        }
        task = self._task(config, image, signing_key)
        self._grant_registry(task.task_role, registry)
        self._grant_files(task.task_role)
        task.task_role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="PublishPublicKeys",
                actions=["ssm:PutParameter"],
                resources=[parameter_arn(self, config.jwks_parameter)],
            )
        )
        acknowledge(
            task,
            "AwsSolutions-ECS2",
            "Only non-secret settings are plain variables; the signing key is an ECS secret.",
        )
        acknowledge_wildcard_resource(task.obtain_execution_role(), "*", ECR_AUTH_REASON)
        self.service = self._service(config, cluster, task)
        # The first task must find the signing key in its secret.
        self.service.node.add_dependency(signing_key.key)
        self.target_group = self._target_group(config, vpc)
        self._listen(config)
        if config.ops_scraper_security_group:
            scraper = ec2.SecurityGroup.from_security_group_id(
                self, "OpsScraper", config.ops_scraper_security_group, mutable=False
            )
            self.service.connections.allow_from(
                scraper, ec2.Port.tcp(OPS_PORT), "scrapes the gateways' /metrics and /readyz"
            )
        self._scale(config)

    def _access_logs(self) -> s3.Bucket:
        access_logs = s3.Bucket(
            self,
            "AccessLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,  # the only one ALB log delivery supports
            enforce_ssl=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=[s3.LifecycleRule(expiration=Duration.days(ACCESS_LOG_DAYS))],
            removal_policy=RemovalPolicy.RETAIN,
        )
        acknowledge(
            access_logs,
            "AwsSolutions-S1",
            "This bucket holds the load balancer's and the files bucket's access logs; logging it "
            "would log the logs.",
        )
        return access_logs

    def _files(self) -> s3.Bucket:
        """The bucket of the files' contents (`/v1/files`) and of batches' results."""
        return s3.Bucket(
            self,
            "Files",
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            # Who read or wrote a customer's file: with the load balancer's, ACCESS_LOG_DAYS.
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="files/",
            # Customers' uploads and their batches' output: never deleted with the stack.
            removal_policy=RemovalPolicy.RETAIN,
        )

    def _load_balancer(self, config: DeployConfig, vpc: ec2.IVpc) -> elbv2.ApplicationLoadBalancer:
        load_balancer = elbv2.ApplicationLoadBalancer(
            self,
            "LoadBalancer",
            vpc=vpc,
            internet_facing=True,
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PUBLIC),
            # Websockets and SSE streams sit quiet while queued or thinking; the default 60 s
            # would cut them.
            idle_timeout=Duration.seconds(config.alb_idle_timeout_seconds),
            drop_invalid_header_fields=True,
        )
        load_balancer.log_access_logs(self.access_logs, prefix="alb")
        for security_group in load_balancer.connections.security_groups:
            acknowledge(
                security_group,
                "AwsSolutions-EC23",
                "The public API: clients anywhere connect, and authenticate with API keys.",
            )
        return load_balancer

    def _own_environment(self, config: DeployConfig, vpc: ec2.IVpc) -> dict[str, str]:
        """The settings of the gateways' own: listeners, URL, models, the ALB in front."""
        return {
            **env_names(
                SharedSettings, {"log_format": "json", "files_bucket": self.files.bucket_name}
            ),
            **env_names(
                GatewaySettings,
                {
                    "host": "0.0.0.0",  # noqa: S104 — the ALB reaches the task's IP
                    "port": str(GATEWAY_PORT),
                    "ops_port": str(OPS_PORT),
                    "public_url": self.public_url,
                    # Agents read the public keys there with their role, never through the
                    # internet.
                    "jwks_parameter": config.jwks_parameter,
                    "models": json.dumps(config.model_names),
                    "shutdown_grace_seconds": str(config.gateway_drain_seconds),
                    # Agents live in the pool's VPCs: a registry row naming any other address
                    # is ignored.
                    "agent_networks": json.dumps(
                        [vpc.vpc_cidr_block, *(r.vpc_cidr for r in config.pool_regions)]
                    ),
                    # The ALB appends the client's address: failed logins are counted per
                    # client.
                    "trusted_proxy_hops": "1",
                    # The ALB must be the side that closes idle connections.
                    "keepalive_seconds": str(
                        config.alb_idle_timeout_seconds + KEEPALIVE_MARGIN_SECONDS
                    ),
                },
            ),
        }

    def _task(
        self, config: DeployConfig, image: ecs.ContainerImage, signing_key: SigningKey
    ) -> ecs.FargateTaskDefinition:
        task = ecs.FargateTaskDefinition(
            self,
            "Task",
            cpu=config.gateway_cpu,
            memory_limit_mib=config.gateway_memory_mib,
            runtime_platform=ecs.RuntimePlatform(
                cpu_architecture=ecs.CpuArchitecture.X86_64,
                operating_system_family=ecs.OperatingSystemFamily.LINUX,
            ),
        )
        task.add_container(
            "gateway",
            image=image,
            command=["gateway"],
            environment=self.environment,
            secrets={SIGNING_KEY_ENV: ecs.Secret.from_secrets_manager(signing_key.secret)},
            logging=ecs.LogDrivers.aws_logs(stream_prefix="gateway", log_group=self.log_group),
            # The first is the one the target group forwards to; operations are never.
            port_mappings=[
                ecs.PortMapping(container_port=GATEWAY_PORT),
                ecs.PortMapping(container_port=OPS_PORT),
            ],
            # SIGTERM starts the drain (SHUTDOWN_GRACE_SECONDS); SIGKILL must come later.
            stop_timeout=Duration.seconds(config.gateway_stop_timeout_seconds),
            health_check=ecs.HealthCheck(
                command=["CMD", "python", "-c", CONTAINER_HEALTH_COMMAND],
                interval=Duration.seconds(HEALTH_CHECK_INTERVAL_SECONDS),
                timeout=Duration.seconds(5),
                retries=3,
                start_period=Duration.seconds(HEALTH_CHECK_GRACE_SECONDS),
            ),
        )
        return task

    def _service(
        self, config: DeployConfig, cluster: ecs.ICluster, task: ecs.FargateTaskDefinition
    ) -> ecs.FargateService:
        return ecs.FargateService(
            self,
            "Service",
            cluster=cluster,
            task_definition=task,
            desired_count=config.gateway_min_tasks,
            min_healthy_percent=100,
            max_healthy_percent=200,
            circuit_breaker=ecs.DeploymentCircuitBreaker(rollback=True),
            health_check_grace_period=Duration.seconds(HEALTH_CHECK_GRACE_SECONDS),
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            assign_public_ip=False,
        )

    def _target_group(self, config: DeployConfig, vpc: ec2.IVpc) -> elbv2.ApplicationTargetGroup:
        return elbv2.ApplicationTargetGroup(
            self,
            "Targets",
            vpc=vpc,
            port=GATEWAY_PORT,
            protocol=elbv2.ApplicationProtocol.HTTP,
            target_type=elbv2.TargetType.IP,
            targets=[self.service],
            # The ALB keeps a leaving task's connections this long: the gateway's own drain.
            deregistration_delay=Duration.seconds(config.gateway_drain_seconds),
            health_check=elbv2.HealthCheck(
                path=HEALTH_PATH,
                healthy_http_codes="200",
                interval=Duration.seconds(HEALTH_CHECK_INTERVAL_SECONDS),
                healthy_threshold_count=2,
                unhealthy_threshold_count=3,
            ),
        )

    def _scale(self, config: DeployConfig) -> None:
        scaling = self.service.auto_scale_task_count(
            min_capacity=config.gateway_min_tasks, max_capacity=config.gateway_max_tasks
        )
        scaling.scale_on_cpu_utilization(
            "Cpu",
            target_utilization_percent=CPU_TARGET_PERCENT,
            scale_out_cooldown=Duration.seconds(SCALE_OUT_COOLDOWN_SECONDS),
            scale_in_cooldown=Duration.seconds(SCALE_IN_COOLDOWN_SECONDS),
        )
        # New connections per task: a websocket counts once when it opens, so long-lived
        # sockets are covered by the CPU policy (relaying is what costs CPU).
        scaling.scale_on_request_count(
            "Requests",
            requests_per_target=config.gateway_requests_per_target,
            target_group=self.target_group,
            scale_out_cooldown=Duration.seconds(SCALE_OUT_COOLDOWN_SECONDS),
            scale_in_cooldown=Duration.seconds(SCALE_IN_COOLDOWN_SECONDS),
        )

    @property
    def security_group(self) -> ec2.ISecurityGroup:
        """The gateway tasks' security group (the agents admit it)."""
        return self.service.connections.security_groups[0]

    def _listen(self, config: DeployConfig) -> None:
        if not config.https:  # `allowPlainHttp`: said at every synthesis
            Annotations.of(self).add_warning_v2(
                "spotgate:plain-http",
                "allowPlainHttp: the gateway listens on plain HTTP; API keys, tokens and "
                "prompts cross the internet in clear. Give certificateArn for real use.",
            )
            self.load_balancer.add_listener(
                "Http",
                port=80,
                protocol=elbv2.ApplicationProtocol.HTTP,
                default_target_groups=[self.target_group],
            )
        else:
            self.load_balancer.add_listener(
                "Https",
                port=443,
                protocol=elbv2.ApplicationProtocol.HTTPS,
                certificates=[elbv2.ListenerCertificate.from_arn(config.certificate_arn)],
                ssl_policy=elbv2.SslPolicy.RECOMMENDED_TLS,
                default_target_groups=[self.target_group],
            )
            self.load_balancer.add_redirect(source_port=80, target_port=443)
        # Readiness and metrics name internal hosts and counts: they are on OPS_PORT, which
        # no listener forwards to, so no path rule is needed (nor could one catch every
        # spelling of a path the gateway decodes).

    @staticmethod
    def _grant_registry(role: iam.IRole, registry: Registry) -> None:
        agents = registry.agents.table_arn
        role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="ReadAgents",
                actions=["dynamodb:Query"],
                resources=[f"{agents}/index/{BY_CHANGE_INDEX}"],
            )
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                # What the pool manager vouches for of each agent: read, never written.
                sid="ReadLaunches",
                actions=["dynamodb:BatchGetItem"],
                resources=[registry.launches.table_arn],
            )
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="CheckKeys", actions=["dynamodb:GetItem"], resources=[registry.keys.table_arn]
            )
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                # Its queue out; the pool manager's forecasts for queued models in.
                sid="PublishDemand",
                actions=["dynamodb:PutItem", "dynamodb:GetItem"],
                resources=[registry.demand.table_arn],
            )
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="AddUsage",
                actions=["dynamodb:UpdateItem"],
                resources=[registry.usage.table_arn],
            )
        )
        batches = registry.batches.table_arn
        role.add_to_principal_policy(
            iam.PolicyStatement(
                # Files' and batches' records: made, listed per key, leased, ended, deleted,
                # and scanned hourly for expired files (their contents go with them).
                sid="KeepBatches",
                actions=[
                    "dynamodb:GetItem",
                    "dynamodb:PutItem",
                    "dynamodb:UpdateItem",
                    "dynamodb:DeleteItem",
                    "dynamodb:Query",
                    "dynamodb:Scan",
                ],
                resources=[batches],
            )
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                # Every replica looks there for a batch whose lease has run out.
                sid="FindBatchWork",
                actions=["dynamodb:Query"],
                resources=[f"{batches}/index/{BY_WORK_INDEX}"],
            )
        )

    def _grant_files(self, role: iam.IRole) -> None:
        role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="KeepFiles",
                actions=["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
                resources=[self.files.arn_for_objects("*")],
            )
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                # A batch's finished lines are listed to gather its output files; and only a
                # role that may list hears 404, not 403, for a key that is not there.
                sid="ListFiles",
                actions=["s3:ListBucket"],
                resources=[self.files.bucket_arn],
            )
        )
        bucket = cast(CfnElement, self.files.node.default_child)  # a bucket's is its CfnBucket
        acknowledge_wildcard_resource(
            role,
            f"<{Stack.of(self).get_logical_id(bucket)}.Arn>/*",
            "Any file or batch result in the gateways' own files bucket: ids are made per upload.",
        )
