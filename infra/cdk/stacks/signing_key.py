"""The gateway's token signing key: an Ed25519 PEM in Secrets Manager, made at first deploy."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import CustomResource, Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from stacks.common import acknowledge, log_group

GENERATOR_SOURCE = Path(__file__).parent / "functions" / "signing_key.js"
GENERATOR_TIMEOUT_SECONDS = 30
GENERATOR_RUNTIME = lambda_.Runtime.NODEJS_24_X
"""Node's crypto makes Ed25519 keys; Python's Lambda runtime has no library for them."""


class SigningKey(Construct):
    """A secret holding the gateway's private key; only the gateway's tasks can read it."""

    def __init__(self, scope: Construct, construct_id: str, *, log_retention_days: int) -> None:
        super().__init__(scope, construct_id)
        self.secret = secretsmanager.Secret(
            self,
            "Secret",
            description=(
                "spotgate gateway token signing keys (Ed25519, PKCS#8 PEM, oldest first; "
                "the last signs). Rotate by appending a key and restarting the gateways."
            ),
        )
        acknowledge(
            self.secret,
            "AwsSolutions-SMG4",
            "Signing keys rotate by appending a PEM (old tokens stay valid); no rotation Lambda.",
        )

        logs = log_group(self, "GeneratorLogs", log_retention_days)
        role = iam.Role(
            self,
            "GeneratorRole",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description="spotgate: writes the first signing key into its secret",
        )
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["secretsmanager:GetSecretValue", "secretsmanager:PutSecretValue"],
                resources=[self.secret.secret_arn],
            )
        )
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[logs.log_group_arn],
            )
        )
        generator = lambda_.Function(
            self,
            "Generator",
            runtime=GENERATOR_RUNTIME,
            handler="index.handler",
            code=lambda_.Code.from_inline(GENERATOR_SOURCE.read_text()),
            role=role,
            log_group=logs,
            timeout=Duration.seconds(GENERATOR_TIMEOUT_SECONDS),
            description="spotgate: puts an Ed25519 signing key in the gateway's secret",
        )
        self.key = CustomResource(
            self,
            "Key",
            service_token=generator.function_arn,
            resource_type="Custom::SpotgateSigningKey",
            properties={"SecretId": self.secret.secret_arn},
        )
