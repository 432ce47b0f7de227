"""Small helpers every construct shares: log groups with retention, cdk-nag acknowledgements."""

from __future__ import annotations

from aws_cdk import Acknowledgment, RemovalPolicy, Stack, Validations
from aws_cdk import aws_logs as logs
from constructs import Construct, IConstruct

from stacks.config import ConfigError

# CloudWatch Logs accepts only these retention periods.
_RETENTION_BY_DAYS: dict[int, logs.RetentionDays] = {
    1: logs.RetentionDays.ONE_DAY,
    3: logs.RetentionDays.THREE_DAYS,
    5: logs.RetentionDays.FIVE_DAYS,
    7: logs.RetentionDays.ONE_WEEK,
    14: logs.RetentionDays.TWO_WEEKS,
    30: logs.RetentionDays.ONE_MONTH,
    60: logs.RetentionDays.TWO_MONTHS,
    90: logs.RetentionDays.THREE_MONTHS,
    120: logs.RetentionDays.FOUR_MONTHS,
    150: logs.RetentionDays.FIVE_MONTHS,
    180: logs.RetentionDays.SIX_MONTHS,
    365: logs.RetentionDays.ONE_YEAR,
    400: logs.RetentionDays.THIRTEEN_MONTHS,
    545: logs.RetentionDays.EIGHTEEN_MONTHS,
    731: logs.RetentionDays.TWO_YEARS,
    1096: logs.RetentionDays.THREE_YEARS,
    1827: logs.RetentionDays.FIVE_YEARS,
    2192: logs.RetentionDays.SIX_YEARS,
    2557: logs.RetentionDays.SEVEN_YEARS,
    2922: logs.RetentionDays.EIGHT_YEARS,
    3288: logs.RetentionDays.NINE_YEARS,
    3653: logs.RetentionDays.TEN_YEARS,
}


def retention(days: int) -> logs.RetentionDays:
    """The `RetentionDays` for `days`; only CloudWatch's own periods are accepted."""
    try:
        return _RETENTION_BY_DAYS[days]
    except KeyError:
        allowed = ", ".join(str(value) for value in _RETENTION_BY_DAYS)
        raise ConfigError(f"logRetentionDays: {days} is not one of {allowed}") from None


def log_group(scope: Construct, construct_id: str, retention_days: int) -> logs.LogGroup:
    """A log group that keeps `retention_days` of logs and goes away with the stack."""
    return logs.LogGroup(
        scope,
        construct_id,
        retention=retention(retention_days),
        removal_policy=RemovalPolicy.DESTROY,
    )


ECR_AUTH_REASON = "ecr:GetAuthorizationToken (image pull) has no resource-level permissions in IAM."
NAG_PLUGIN = "AwsSolutions"
"""cdk-nag's AWS Solutions pack: acknowledgements are `<plugin>::<rule>[<finding>]`."""


def acknowledge(construct: IConstruct, rule: str, reason: str) -> None:
    """Acknowledge one cdk-nag finding on `construct` (and its children), with its reason."""
    Validations.of(construct).acknowledge(Acknowledgment(id=f"{NAG_PLUGIN}::{rule}", reason=reason))


def acknowledge_wildcard_resource(construct: IConstruct, resource: str, reason: str) -> None:
    """Acknowledge cdk-nag's IAM5 finding for one wildcard `resource` (as cdk-nag prints it)."""
    acknowledge(construct, f"AwsSolutions-IAM5[Resource::{resource}]", reason)


def parameter_arn(scope: Construct, name: str, region: str | None = None) -> str:
    """The ARN of the SSM parameter `name` (a path from `/`) in `region` (None: the stack's)."""
    return Stack.of(scope).format_arn(
        service="ssm", region=region, resource="parameter", resource_name=name.removeprefix("/")
    )
