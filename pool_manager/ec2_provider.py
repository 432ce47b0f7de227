"""The `ec2` provider: agents on EC2 instances, each launched from its model's launch template.

A thin adapter over one long-lived aioboto3 EC2 client. Each launch is one instant EC2 Fleet
of one instance (spot or on-demand, one instance type, one subnet), so a placement that has
no capacity answers at once with an error code instead of leaving a request open. Where
`CreateFleet` is not available (an emulator, or a role not allowed to call it) the launch
falls back to `RunInstances` with the same template, placement and tags. A model's template
carries what its agents run (weights, revision, engine arguments: the CDK app writes one per
model), so a launch for one model can never boot another.

Every instance carries the tags `spotgate:pool`, `spotgate:model` and `spotgate:lifecycle`;
`instances()` lists the pool by its tag, so instances started by hand are never touched.

An on-demand instance may be stopped into its model's warm pool (`StopInstances`: the root
volume keeps the image and, on the volume, the weights) and started again
(`StartInstances`). EC2 keeps its id, its private address and its tags; the provider tags
when it was stopped and started (`spotgate:stopped-at`, `spotgate:started-at`) and that a
boot is warm (`spotgate:boot`), as EC2's own `LaunchTime` need not say so.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Self

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from pool_manager.ec2_api import (
    BOOT_TAG,
    FLEET_UNAVAILABLE_CODES,
    INSTANCE_NOT_FOUND_CODE,
    LIFECYCLE_TAG,
    MODEL_TAG,
    NAME_TAG,
    POOL_TAG,
    SPOT_PRODUCTS,
    STARTED_AT_TAG,
    STOPPED_AT_TAG,
    TEMPLATE_TAG,
    WARM_POOL_TAG,
    error_code,
    error_text,
    fleet_refusal,
    instance_from_description,
    is_capacity_error,
    latest_spot_prices,
    launch_failure,
    stopped_from_description,
    tags_of,
)
from pool_manager.pool_view import Launch, PlacementKey
from pool_manager.provider import (
    CapacityRefused,
    Instance,
    ProviderError,
    StartRefused,
    StoppedInstance,
)
from spotgate.logging import get_logger, one_line
from spotgate.registry import aws_session, instance_agent_id
from spotgate.settings import PoolSettings, SharedSettings

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class TemplateVersion:
    """One version of a launch template."""

    template_id: str
    number: str

    @property
    def tag(self) -> str:
        """How an instance launched from it is tagged (`spotgate:template`)."""
        return f"{self.template_id}:{self.number}"


# No EC2 type stubs are installed (only DynamoDB's), so the client is untyped.
Ec2Client = Any
Clock = Callable[[], float]
ClientWrapper = Callable[[Ec2Client], Ec2Client]

LAUNCH_TEMPLATE_ID_PREFIX = "lt-"
LAUNCH_TEMPLATE_VERSION = "$Latest"
LISTED_STATES = ("pending", "running")
STOPPED_STATES = ("stopping", "stopped")
"""A stopping instance is in the warm pool already: counted, though it starts only once
stopped (EC2 refuses the start until then)."""
CLIENT_CONNECT_TIMEOUT_SECONDS = 5
CLIENT_MAX_ATTEMPTS = 3


class Ec2Provider:
    """`Provider` on EC2: instant fleets of one, listed and terminated by the pool's tag."""

    def __init__(
        self,
        client: Ec2Client,
        settings: PoolSettings,
        account: str,
        clock: Clock = time.time,
    ) -> None:
        self._client = client
        self._ec2 = settings.ec2
        self._settings = settings
        self._account = account
        self._clock = clock

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        shared: SharedSettings,
        settings: PoolSettings,
        clock: Clock = time.time,
        wrap_client: ClientWrapper | None = None,
    ) -> AsyncIterator[Self]:
        """Open the provider's EC2 client for the life of the `async with` block."""
        aws = shared.aws
        config = Config(
            retries={"max_attempts": CLIENT_MAX_ATTEMPTS, "mode": "standard"},
            connect_timeout=CLIENT_CONNECT_TIMEOUT_SECONDS,
        )
        session = aws_session(aws)
        async with AsyncExitStack() as stack:
            client = await stack.enter_async_context(
                session.client("ec2", endpoint_url=aws.endpoint_url, config=config)
            )
            async with session.client("sts", endpoint_url=aws.endpoint_url, config=config) as sts:
                # The account the instances run in: their ARNs are their agents' ids. No IAM
                # permission is needed to ask.
                account = str((await sts.get_caller_identity())["Account"])
            # Tests wrap the real client to inject answers AWS gives but an emulator cannot.
            yield cls(wrap_client(client) if wrap_client else client, settings, account, clock)

    # -- launch --

    async def launch(self, model: str, launch: Launch) -> Instance:
        """Start one instance for `model` in the launch's placement and lifecycle."""
        # The template's latest version, named and tagged: a warm instance of an older one
        # is known for stale once a deploy changes the template.
        version = await self._latest_version(self._template_name(model))
        try:
            answer = await self._client.create_fleet(**self._fleet_request(model, launch, version))
        except ClientError as err:
            code = error_code(err)
            if code in FLEET_UNAVAILABLE_CODES:
                log.info("create_fleet unavailable, using run_instances", code=code)
                return await self._run_instance(model, launch, version)
            if is_capacity_error(code):
                raise CapacityRefused(launch, one_line(error_text(err))) from err
            raise ProviderError(launch_failure(launch, "create_fleet", err)) from err
        except BotoCoreError as err:
            raise ProviderError(launch_failure(launch, "create_fleet", err)) from err

        instance_ids = [
            instance_id
            for entry in answer.get("Instances", [])
            for instance_id in entry.get("InstanceIds", [])
        ]
        if not instance_ids:
            raise fleet_refusal(launch, answer.get("Errors", []))
        instance_id = str(instance_ids[0])
        return self._launched(instance_id, model, launch)

    def _fleet_request(
        self, model: str, launch: Launch, version: TemplateVersion | None
    ) -> dict[str, Any]:
        override: dict[str, str] = {"InstanceType": launch.instance_type}
        subnet = self._ec2.subnets.get(launch.zone)
        if subnet is not None:
            override["SubnetId"] = subnet
        else:
            override["AvailabilityZone"] = launch.zone
        return {
            # `instant`: one synchronous answer (instances or errors), no request left open
            # that could launch later behind the policy's back.
            "Type": "instant",
            "LaunchTemplateConfigs": [
                {
                    "LaunchTemplateSpecification": self._template_spec(model, version),
                    "Overrides": [override],
                }
            ],
            "TargetCapacitySpecification": {
                "TotalTargetCapacity": 1,
                "DefaultTargetCapacityType": launch.lifecycle,
            },
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": self._tags(model, launch, version)}
            ],
        }

    async def _run_instance(
        self, model: str, launch: Launch, version: TemplateVersion | None
    ) -> Instance:
        request: dict[str, Any] = {
            "MinCount": 1,
            "MaxCount": 1,
            "LaunchTemplate": self._template_spec(model, version),
            "InstanceType": launch.instance_type,
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": self._tags(model, launch, version)}
            ],
        }
        subnet = self._ec2.subnets.get(launch.zone)
        if subnet is not None:
            request["SubnetId"] = subnet
        else:
            request["Placement"] = {"AvailabilityZone": launch.zone}
        if launch.lifecycle == "spot":
            request["InstanceMarketOptions"] = {
                "MarketType": "spot",
                # One-time and terminate: an interrupted agent is replaced by the pool
                # manager, never revived by EC2 behind its back.
                "SpotOptions": {
                    "SpotInstanceType": "one-time",
                    "InstanceInterruptionBehavior": "terminate",
                },
            }
        try:
            answer = await self._client.run_instances(**request)
        except ClientError as err:
            if is_capacity_error(error_code(err)):
                raise CapacityRefused(launch, one_line(error_text(err))) from err
            raise ProviderError(launch_failure(launch, "run_instances", err)) from err
        except BotoCoreError as err:
            raise ProviderError(launch_failure(launch, "run_instances", err)) from err
        instances = answer.get("Instances", [])
        if not instances:
            raise ProviderError(launch_failure(launch, "run_instances", "no instance returned"))
        instance_id = str(instances[0]["InstanceId"])
        return self._launched(instance_id, model, launch)

    def _launched(self, instance_id: str, model: str, launch: Launch) -> Instance:
        # Built from the request, not a describe call: right after a launch EC2's reads are
        # eventually consistent and may not know the instance yet.
        return Instance(
            instance_id=instance_id,
            agent_id=self._agent_id(instance_id),
            model=model,
            lifecycle=launch.lifecycle,
            instance_type=launch.instance_type,
            zone=launch.zone,
            launched_at=self._clock(),
            for_warm_pool=launch.for_warm_pool,
        )

    def _agent_id(self, instance_id: str) -> str:
        meta = self._client.meta
        return instance_agent_id(meta.partition, meta.region_name, self._account, instance_id)

    def _template_name(self, model: str) -> str:
        """The model's own launch template (what its agents boot), else the pool's: id or name."""
        served = self._settings.model(model)
        return (served and served.launch_template) or self._ec2.launch_template

    def _template_spec(self, model: str, version: TemplateVersion | None) -> dict[str, str]:
        """The model's launch template as a launch names it: this version, else its latest."""
        if version is not None:
            return {"LaunchTemplateId": version.template_id, "Version": version.number}
        template = self._template_name(model)
        key = (
            "LaunchTemplateId"
            if template.startswith(LAUNCH_TEMPLATE_ID_PREFIX)
            else "LaunchTemplateName"
        )
        return {key: template, "Version": LAUNCH_TEMPLATE_VERSION}

    def _tags(
        self, model: str, launch: Launch, version: TemplateVersion | None
    ) -> list[dict[str, str]]:
        pool = self._ec2.pool_name
        tags = [
            {"Key": POOL_TAG, "Value": pool},
            {"Key": MODEL_TAG, "Value": model},
            {"Key": LIFECYCLE_TAG, "Value": launch.lifecycle},
            {"Key": NAME_TAG, "Value": f"{pool}-{model}"},
        ]
        if launch.for_warm_pool:
            tags.append({"Key": WARM_POOL_TAG, "Value": "true"})
        if version is not None:
            tags.append({"Key": TEMPLATE_TAG, "Value": version.tag})
        return tags

    # -- list --

    async def instances(self) -> list[Instance]:
        """The pool's pending and running instances (found by the `spotgate:pool` tag)."""
        return [
            instance_from_description(item, self._agent_id(item["InstanceId"]))
            for item in await self._described(LISTED_STATES)
        ]

    async def stopped(self) -> list[StoppedInstance]:
        """The pool's stopping and stopped instances: its models' warm pools.

        One launched from an older version of its model's launch template than the latest
        (a deploy changed it since) is `stale`: started, it would boot what ran before.
        """
        described = await self._described(STOPPED_STATES)
        templates = {
            self._template_name(model)
            for model in {tags_of(i).get(MODEL_TAG, "") for i in described}
        }
        latest = {template: await self._latest_version(template) for template in templates}
        found = []
        for item in described:
            tags = tags_of(item)
            current = latest[self._template_name(tags.get(MODEL_TAG, ""))]
            booted = tags.get(TEMPLATE_TAG)  # none: launched before the pool tagged it
            stale = current is not None and booted is not None and booted != current.tag
            found.append(stopped_from_description(item, self._agent_id(item["InstanceId"]), stale))
        return found

    async def _latest_version(self, template: str) -> TemplateVersion | None:
        """The launch template's latest version (None: it could not be read)."""
        key = (
            "LaunchTemplateIds"
            if template.startswith(LAUNCH_TEMPLATE_ID_PREFIX)
            else "LaunchTemplateNames"
        )
        try:
            reply = await self._client.describe_launch_templates(**{key: [template]})
        except (ClientError, BotoCoreError) as err:
            # A launch names `$Latest` instead, and a warm pool's instances are not stale.
            log.warning(
                "launch template unreadable: its latest version is not known",
                template=template,
                error=one_line(error_text(err)),
            )
            return None
        (described,) = reply["LaunchTemplates"]  # one asked for: found, or an error
        return TemplateVersion(
            str(described["LaunchTemplateId"]), str(described["LatestVersionNumber"])
        )

    async def _described(self, states: Sequence[str]) -> list[Mapping[str, Any]]:
        """The pool's instances in these states, as `describe_instances` gives them."""
        paginator = self._client.get_paginator("describe_instances")
        found: list[Mapping[str, Any]] = []
        try:
            async for page in paginator.paginate(
                Filters=[
                    {"Name": f"tag:{POOL_TAG}", "Values": [self._ec2.pool_name]},
                    {"Name": "instance-state-name", "Values": list(states)},
                ]
            ):
                for reservation in page.get("Reservations", []):
                    found.extend(reservation.get("Instances", []))
        except (ClientError, BotoCoreError) as err:
            raise ProviderError(one_line(f"describe_instances failed: {error_text(err)}")) from err
        return found

    # -- the warm pool --

    async def stop(self, instance_id: str) -> None:
        """Stop an on-demand instance into the warm pool (EC2 refuses a spot one)."""
        await self._tag(instance_id, {STOPPED_AT_TAG: repr(self._clock())}, "stop")
        try:
            await self._client.stop_instances(InstanceIds=[instance_id])
        except (ClientError, BotoCoreError) as err:
            raise ProviderError(one_line(f"stop {instance_id} failed: {error_text(err)}")) from err
        log.info("stopped", instance_id=instance_id)

    async def start(self, stopped: StoppedInstance) -> Instance:
        """Start a stopped instance of the warm pool: a warm start.

        EC2 may have no capacity for its type in its zone right now (the instance cannot
        move): that is `StartRefused`, and the pool launches elsewhere instead.
        """
        started_at = self._clock()
        tags = {BOOT_TAG: "warm", STARTED_AT_TAG: repr(started_at)}
        await self._tag(stopped.instance_id, tags, "start")
        try:
            await self._client.start_instances(InstanceIds=[stopped.instance_id])
        except (ClientError, BotoCoreError) as err:
            failure = one_line(f"start {stopped.instance_id} failed: {error_text(err)}")
            if isinstance(err, ClientError) and is_capacity_error(error_code(err)):
                raise StartRefused(failure) from err
            raise ProviderError(failure) from err
        log.info("started from the warm pool", instance_id=stopped.instance_id)
        return Instance(
            instance_id=stopped.instance_id,
            agent_id=stopped.agent_id,
            model=stopped.model,
            lifecycle="on-demand",
            instance_type=stopped.instance_type,
            zone=stopped.zone,
            launched_at=started_at,
            boot="warm",
        )

    async def _tag(self, instance_id: str, tags: Mapping[str, str], action: str) -> None:
        try:
            await self._client.create_tags(
                Resources=[instance_id],
                Tags=[{"Key": key, "Value": value} for key, value in tags.items()],
            )
        except (ClientError, BotoCoreError) as err:
            raise ProviderError(
                one_line(f"{action} {instance_id} failed: tagging it: {error_text(err)}")
            ) from err

    # -- terminate --

    async def terminate(self, instance_id: str) -> None:
        """Terminate an instance; one that is already gone (or never existed) is fine."""
        try:
            await self._client.terminate_instances(InstanceIds=[instance_id])
        except ClientError as err:
            if error_code(err) == INSTANCE_NOT_FOUND_CODE:
                log.info("terminate: instance already gone", instance_id=instance_id)
                return
            raise ProviderError(
                one_line(f"terminate {instance_id} failed: {error_text(err)}")
            ) from err
        except BotoCoreError as err:
            raise ProviderError(
                one_line(f"terminate {instance_id} failed: {error_text(err)}")
            ) from err
        log.info("terminated", instance_id=instance_id)

    async def interruption_noticed(self, instance_id: str, deadline: float) -> None:
        """Nothing to do on EC2: AWS itself reclaims the instance at the deadline."""

    # -- prices --

    async def spot_prices(self, placements: Sequence[PlacementKey]) -> dict[PlacementKey, float]:
        """The current Linux spot price of each placement, from EC2's price history."""
        wanted = set(placements)
        if not wanted:
            return {}
        try:
            answer = await self._client.describe_spot_price_history(
                InstanceTypes=sorted({instance_type for instance_type, _ in wanted}),
                ProductDescriptions=list(SPOT_PRODUCTS),
                StartTime=datetime.fromtimestamp(self._clock(), UTC),  # now: the current price
            )
        except (ClientError, BotoCoreError) as err:
            raise ProviderError(
                one_line(f"describe_spot_price_history failed: {error_text(err)}")
            ) from err
        return latest_spot_prices(answer.get("SpotPriceHistory", []), wanted)
