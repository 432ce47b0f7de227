"""Alarms and a CloudWatch dashboard: ready agents, queue time, interruptions, EC2 events.

The services' own metrics are for Prometheus and Grafana (ops/).

Sources, by alarm: the registry (ready agents, queued streams) through a small function that
publishes it to CloudWatch every minute; the pool manager's log (one JSON line per spot
interruption it acts on) through a metric filter; SQS's own metrics for the events queue.
"""

from __future__ import annotations

import json
from pathlib import Path

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as events_targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from pool_manager.start_failures import LAUNCHES_HELD_LOG_EVENT
from spotgate.registry import POOL_TARGET_SOURCE, AgentState
from stacks.common import acknowledge_wildcard_resource, log_group
from stacks.config import DeployConfig, ModelConfig

METRICS_NAMESPACE = "spotgate"
FUNCTIONS_DIR = Path(__file__).parent / "functions"
METRICS_HANDLER = "registry_metrics.handler"
METRICS_RUNTIME = lambda_.Runtime.PYTHON_3_14
METRICS_PERIOD_MINUTES = 1
METRICS_TIMEOUT_SECONDS = 30
INTERRUPTION_LOG_EVENT = "spot interruption: draining"
"""What the pool manager logs (`event`) when it drains an agent on EC2's interruption warning."""
NO_READY_AGENTS_MINUTES = 5
EVENT_AGE_ALARM_SECONDS = 60
"""The pool manager polls every few seconds: a minute-old EC2 event means it stopped reading."""


class Monitoring(Construct):
    """Registry metrics, the interruption metric filter, and the alarms on them."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: DeployConfig,
        agents_table: dynamodb.ITable,
        demand_table: dynamodb.ITable,
        pool_manager_logs: logs.ILogGroup,
        events_queue: sqs.IQueue,
        dead_letters: sqs.IQueue,
    ) -> None:
        super().__init__(scope, construct_id)
        self._publish_registry_metrics(config, agents_table, demand_table)
        period = Duration.minutes(METRICS_PERIOD_MINUTES)
        self.model_alarms: list[cloudwatch.Alarm] = []
        # The first model's ids are the ones a one-model pool had: its alarms stay put.
        model_graphs: list[cloudwatch.IWidget] = [
            self._model_alarms(config, model, "" if index == 0 else f"-{model.safe_name}", period)
            for index, model in enumerate(config.models)
        ]

        interruptions = self._interruptions(config, pool_manager_logs)
        self.start_failures = self._start_failures(pool_manager_logs, period)
        self._event_alarms(events_queue, dead_letters, period)
        self.dashboard = self._dashboard(
            config, model_graphs, interruptions, events_queue, dead_letters
        )

        if config.alarm_topic_arn:
            topic = sns.Topic.from_topic_arn(self, "AlarmTopic", config.alarm_topic_arn)
            for alarm in self.alarms:
                alarm.add_alarm_action(cloudwatch_actions.SnsAction(topic))

    def _log_event_count(
        self, construct_id: str, log_group: logs.ILogGroup, event: str, metric_name: str
    ) -> logs.MetricFilter:
        """A custom metric counting the log lines whose `event` is `event`."""
        return logs.MetricFilter(
            self,
            construct_id,
            log_group=log_group,
            filter_pattern=logs.FilterPattern.string_value("$.event", "=", event),
            metric_namespace=METRICS_NAMESPACE,
            metric_name=metric_name,
            metric_value="1",
            default_value=0,
        )

    def _interruptions(
        self, config: DeployConfig, pool_manager_logs: logs.ILogGroup
    ) -> logs.MetricFilter:
        """The spot interruptions the pool manager acted on, from its log, and their alarm."""
        interruptions = self._log_event_count(
            "Interruptions", pool_manager_logs, INTERRUPTION_LOG_EVENT, "SpotInterruptions"
        )
        self.interruption_rate = interruptions.metric(
            statistic="Sum", period=Duration.hours(1)
        ).create_alarm(
            self,
            "InterruptionRate",
            alarm_description=(
                f"{config.interruption_alarm_per_hour} or more spot interruptions in an hour: "
                "widen instanceTypes or availabilityZones, or raise spotOverprovision."
            ),
            threshold=config.interruption_alarm_per_hour,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        return interruptions

    def _start_failures(
        self, pool_manager_logs: logs.ILogGroup, period: Duration
    ) -> cloudwatch.Alarm:
        """An alarm while the pool manager holds a model's launches (its agents keep failing)."""
        held = self._log_event_count(
            "LaunchesHeld", pool_manager_logs, LAUNCHES_HELD_LOG_EVENT, "LaunchesHeld"
        )
        return held.metric(statistic="Sum", period=period).create_alarm(
            self,
            "StartFailures",
            alarm_description=(
                "A model's agents failed to start twice in a row the same way: the pool manager "
                "holds its launches. `spotgate pool status` says why (runbook: an agent that "
                "will not start)."
            ),
            threshold=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )

    def _event_alarms(
        self, events_queue: sqs.IQueue, dead_letters: sqs.IQueue, period: Duration
    ) -> None:
        """Alarms on EC2 events the pool manager leaves waiting or fails to handle."""
        self.stalled_events = events_queue.metric_approximate_age_of_oldest_message(
            statistic="Maximum", period=period
        ).create_alarm(
            self,
            "StalledEvents",
            alarm_description="EC2 events wait in the queue: the pool manager is not reading it.",
            threshold=EVENT_AGE_ALARM_SECONDS,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=3,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        self.dead_letters = dead_letters.metric_approximate_number_of_messages_visible(
            statistic="Maximum", period=period
        ).create_alarm(
            self,
            "DeadLetters",
            alarm_description="EC2 events the pool manager failed to handle five times.",
            threshold=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )

    def _dashboard(
        self,
        config: DeployConfig,
        model_graphs: list[cloudwatch.IWidget],
        interruptions: logs.MetricFilter,
        events_queue: sqs.IQueue,
        dead_letters: sqs.IQueue,
    ) -> cloudwatch.Dashboard:
        return cloudwatch.Dashboard(
            self,
            "Dashboard",
            dashboard_name=f"{config.pool_name}-pool",
            widgets=[
                [
                    cloudwatch.AlarmStatusWidget(title="Alarms", alarms=self.alarms, width=24),
                ],
                # Two models' graphs to a row, the interruptions after the last.
                *(model_graphs[start : start + 2] for start in range(0, len(model_graphs), 2)),
                [
                    cloudwatch.GraphWidget(
                        title="Spot interruptions acted on (per hour)",
                        left=[interruptions.metric(statistic="Sum", period=Duration.hours(1))],
                        width=24,
                    ),
                ],
                [
                    cloudwatch.GraphWidget(
                        title="EC2 events: oldest waiting (s) and failed (dead letters)",
                        left=[events_queue.metric_approximate_age_of_oldest_message()],
                        right=[dead_letters.metric_approximate_number_of_messages_visible()],
                        width=24,
                    ),
                ],
            ],
        )

    @property
    def alarms(self) -> list[cloudwatch.Alarm]:
        """Every alarm this construct made."""
        return [
            *self.model_alarms,
            self.interruption_rate,
            self.start_failures,
            self.stalled_events,
            self.dead_letters,
        ]

    def _model_alarms(
        self, config: DeployConfig, model: ModelConfig, suffix: str, period: Duration
    ) -> cloudwatch.GraphWidget:
        """`model`'s NoReadyAgents and HighQueueTime alarms; its dashboard graph."""
        dimensions = {"Model": model.name}
        ready = cloudwatch.Metric(
            namespace=METRICS_NAMESPACE,
            metric_name="ReadyAgents",
            dimensions_map=dimensions,
            statistic="Minimum",
            period=period,
        )
        queued = cloudwatch.Metric(
            namespace=METRICS_NAMESPACE,
            metric_name="QueuedStreams",
            dimensions_map=dimensions,
            statistic="Minimum",
            period=period,
        )
        # With minAgents 0 an empty pool is normal until someone asks; then it is an outage.
        wanted = 1 if model.min_agents > 0 else 0
        no_ready = cloudwatch.MathExpression(
            expression=f"IF(ready < 1 AND (queued > 0 OR {wanted} > 0), 1, 0)",
            using_metrics={"ready": ready, "queued": queued},
            period=period,
            label="no ready agent while one is needed",
        )
        self.model_alarms.append(
            no_ready.create_alarm(
                self,
                f"NoReadyAgents{suffix}",
                alarm_description=(
                    f"No agent of {model.name} is ready while one is needed (its minAgents, or "
                    "queued streams); missing data (the registry metrics stopped) counts as no "
                    "agent."
                ),
                threshold=1,
                comparison_operator=(
                    cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD
                ),
                evaluation_periods=NO_READY_AGENTS_MINUTES,
                treat_missing_data=cloudwatch.TreatMissingData.BREACHING,
            )
        )
        self.model_alarms.append(
            queued.create_alarm(
                self,
                f"HighQueueTime{suffix}",
                alarm_description=(
                    f"Streams for {model.name} have waited for an agent in every sample for "
                    f"{config.queue_alarm_minutes} minutes: queue time is at the gateways' "
                    "deadline and requests end in no_capacity. The model is short of capacity."
                ),
                threshold=1,
                comparison_operator=(
                    cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD
                ),
                evaluation_periods=config.queue_alarm_minutes,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            )
        )
        return cloudwatch.GraphWidget(
            title=f"Ready agents and queued streams ({model.name})",
            left=[ready.with_(statistic="Average"), queued.with_(statistic="Maximum")],
            width=12,
        )

    def _publish_registry_metrics(
        self,
        config: DeployConfig,
        agents_table: dynamodb.ITable,
        demand_table: dynamodb.ITable,
    ) -> None:
        function_logs = log_group(self, "RegistryMetricsLogs", config.log_retention_days)
        role = iam.Role(
            self,
            "RegistryMetricsRole",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description="spotgate: reads the registry, publishes its counts to CloudWatch",
        )
        role.add_to_policy(
            iam.PolicyStatement(
                sid="ReadRegistry",
                actions=["dynamodb:Scan"],
                resources=[agents_table.table_arn, demand_table.table_arn],
            )
        )
        role.add_to_policy(
            iam.PolicyStatement(
                sid="PublishMetrics",
                actions=["cloudwatch:PutMetricData"],
                # PutMetricData has no resource-level permissions; the namespace bounds it.
                resources=["*"],
                conditions={"StringEquals": {"cloudwatch:namespace": METRICS_NAMESPACE}},
            )
        )
        role.add_to_policy(
            iam.PolicyStatement(
                sid="OwnLogs",
                actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[function_logs.log_group_arn],
            )
        )
        acknowledge_wildcard_resource(
            role,
            "*",
            "cloudwatch:PutMetricData has no resource-level permissions; the "
            "cloudwatch:namespace condition limits it to spotgate's namespace.",
        )
        self.registry_metrics = lambda_.Function(
            self,
            "RegistryMetrics",
            runtime=METRICS_RUNTIME,
            handler=METRICS_HANDLER,
            code=lambda_.Code.from_asset(str(FUNCTIONS_DIR), exclude=["*", "!registry_metrics.py"]),
            role=role,
            log_group=function_logs,
            timeout=Duration.seconds(METRICS_TIMEOUT_SECONDS),
            description="spotgate: ready agents and queued streams per model, every minute",
            environment={
                "AGENTS_TABLE": agents_table.table_name,
                "DEMAND_TABLE": demand_table.table_name,
                "MODELS": json.dumps(config.model_names),
                "NAMESPACE": METRICS_NAMESPACE,
                "READY_STATE": AgentState.READY.value,
                "POOL_TARGET_SOURCE": POOL_TARGET_SOURCE,
            },
        )
        events.Rule(
            self,
            "EveryMinute",
            description="spotgate: publish registry metrics",
            schedule=events.Schedule.rate(Duration.minutes(METRICS_PERIOD_MINUTES)),
            targets=[events_targets.LambdaFunction(self.registry_metrics)],
        )
