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
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime
from typing import Any, Self

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from pool_manager.policy import Launch, LaunchLifecycle, PlacementKey
from pool_manager.provider import CapacityRefused, Instance, ProviderError
from spotgate.logging import get_logger
from spotgate.registry import aws_session, instance_agent_id
from spotgate.settings import PoolSettings, SharedSettings

log = get_logger(__name__)

# No EC2 type stubs are installed (only DynamoDB's), so the client is untyped.
Ec2Client = Any
Clock = Callable[[], float]
ClientWrapper = Callable[[Ec2Client], Ec2Client]

POOL_TAG = "spotgate:pool"
MODEL_TAG = "spotgate:model"
LIFECYCLE_TAG = "spotgate:lifecycle"
NAME_TAG = "Name"

LAUNCH_TEMPLATE_ID_PREFIX = "lt-"
LAUNCH_TEMPLATE_VERSION = "$Latest"
LISTED_STATES = ("pending", "running")
CLIENT_CONNECT_TIMEOUT_SECONDS = 5
CLIENT_MAX_ATTEMPTS = 3

# Error codes that mean "this placement has no room for this launch right now": the policy
# should try another (type, zone) or lifecycle, not treat it as a broken deployment.
CAPACITY_ERROR_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "InsufficientCapacityOnHost",
        "SpotMaxPriceTooLow",
        "MaxSpotInstanceCountExceeded",
        "UnfulfillableCapacity",
        "capacity-not-available",
    }
)

# `CreateFleet` refused as an operation (not as a launch): fall back to `RunInstances`.
FLEET_UNAVAILABLE_CODES = frozenset(
    {
        "UnsupportedOperation",
        "InvalidParameterCombination",
        "UnauthorizedOperation",
        "InvalidAction",
        "NotImplemented",
    }
)

INSTANCE_NOT_FOUND_CODE = "InvalidInstanceID.NotFound"
SPOT_PRODUCTS = ("Linux/UNIX", "Linux/UNIX (Amazon VPC)")
"""The spot price histories of instances like ours (EC2 names both)."""


def is_capacity_error(code: str) -> bool:
    """Whether an EC2 error code means the placement is out of capacity (not a fault)."""
    # New capacity codes appear over time (and per API); every one of them names capacity.
    return code in CAPACITY_ERROR_CODES or "capacity" in code.lower()


def _error_code(err: ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


def _error_text(err: BotoCoreError | ClientError) -> str:
    if isinstance(err, ClientError):
        error = err.response.get("Error", {})
        return f"{error.get('Code', 'error')}: {error.get('Message', '')}".strip()
    return str(err)


def _one_line(text: str) -> str:
    return " ".join(text.split())


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
        try:
            answer = await self._client.create_fleet(**self._fleet_request(model, launch))
        except ClientError as err:
            code = _error_code(err)
            if code in FLEET_UNAVAILABLE_CODES:
                log.info("create_fleet unavailable, using run_instances", code=code)
                return await self._run_instance(model, launch)
            if is_capacity_error(code):
                raise CapacityRefused(launch, _one_line(_error_text(err))) from err
            raise ProviderError(_launch_failure(launch, "create_fleet", err)) from err
        except BotoCoreError as err:
            raise ProviderError(_launch_failure(launch, "create_fleet", err)) from err

        instance_ids = [
            instance_id
            for entry in answer.get("Instances", [])
            for instance_id in entry.get("InstanceIds", [])
        ]
        if not instance_ids:
            raise _fleet_refusal(launch, answer.get("Errors", []))
        instance_id = str(instance_ids[0])
        return self._launched(instance_id, model, launch)

    def _fleet_request(self, model: str, launch: Launch) -> dict[str, Any]:
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
                    "LaunchTemplateSpecification": self._template_spec(model),
                    "Overrides": [override],
                }
            ],
            "TargetCapacitySpecification": {
                "TotalTargetCapacity": 1,
                "DefaultTargetCapacityType": launch.lifecycle,
            },
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": self._tags(model, launch.lifecycle)}
            ],
        }

    async def _run_instance(self, model: str, launch: Launch) -> Instance:
        request: dict[str, Any] = {
            "MinCount": 1,
            "MaxCount": 1,
            "LaunchTemplate": self._template_spec(model),
            "InstanceType": launch.instance_type,
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": self._tags(model, launch.lifecycle)}
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
            if is_capacity_error(_error_code(err)):
                raise CapacityRefused(launch, _one_line(_error_text(err))) from err
            raise ProviderError(_launch_failure(launch, "run_instances", err)) from err
        except BotoCoreError as err:
            raise ProviderError(_launch_failure(launch, "run_instances", err)) from err
        instances = answer.get("Instances", [])
        if not instances:
            raise ProviderError(_launch_failure(launch, "run_instances", "no instance returned"))
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
        )

    def _agent_id(self, instance_id: str) -> str:
        meta = self._client.meta
        return instance_agent_id(meta.partition, meta.region_name, self._account, instance_id)

    def _template_spec(self, model: str) -> dict[str, str]:
        """The model's own launch template (what its agents boot), else the pool's."""
        served = self._settings.model(model)
        template = (served and served.launch_template) or self._ec2.launch_template
        key = (
            "LaunchTemplateId"
            if template.startswith(LAUNCH_TEMPLATE_ID_PREFIX)
            else "LaunchTemplateName"
        )
        return {key: template, "Version": LAUNCH_TEMPLATE_VERSION}

    def _tags(self, model: str, lifecycle: LaunchLifecycle) -> list[dict[str, str]]:
        pool = self._ec2.pool_name
        return [
            {"Key": POOL_TAG, "Value": pool},
            {"Key": MODEL_TAG, "Value": model},
            {"Key": LIFECYCLE_TAG, "Value": lifecycle},
            {"Key": NAME_TAG, "Value": f"{pool}-{model}"},
        ]

    # -- list --

    async def instances(self) -> list[Instance]:
        """The pool's pending and running instances (found by the `spotgate:pool` tag)."""
        paginator = self._client.get_paginator("describe_instances")
        found: list[Instance] = []
        try:
            async for page in paginator.paginate(
                Filters=[
                    {"Name": f"tag:{POOL_TAG}", "Values": [self._ec2.pool_name]},
                    {"Name": "instance-state-name", "Values": list(LISTED_STATES)},
                ]
            ):
                for reservation in page.get("Reservations", []):
                    found.extend(
                        _instance_from_description(item, self._agent_id(item["InstanceId"]))
                        for item in reservation.get("Instances", [])
                    )
        except (ClientError, BotoCoreError) as err:
            raise ProviderError(
                _one_line(f"describe_instances failed: {_error_text(err)}")
            ) from err
        return found

    # -- terminate --

    async def terminate(self, instance_id: str) -> None:
        """Terminate an instance; one that is already gone (or never existed) is fine."""
        try:
            await self._client.terminate_instances(InstanceIds=[instance_id])
        except ClientError as err:
            if _error_code(err) == INSTANCE_NOT_FOUND_CODE:
                log.info("terminate: instance already gone", instance_id=instance_id)
                return
            raise ProviderError(
                _one_line(f"terminate {instance_id} failed: {_error_text(err)}")
            ) from err
        except BotoCoreError as err:
            raise ProviderError(
                _one_line(f"terminate {instance_id} failed: {_error_text(err)}")
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
                _one_line(f"describe_spot_price_history failed: {_error_text(err)}")
            ) from err
        return latest_spot_prices(answer.get("SpotPriceHistory", []), wanted)


def latest_spot_prices(
    history: Sequence[Mapping[str, Any]], wanted: Collection[PlacementKey]
) -> dict[PlacementKey, float]:
    """The newest price of each wanted (type, zone) in a spot price history."""
    newest: dict[PlacementKey, tuple[datetime, float]] = {}
    for entry in history:
        key = (entry["InstanceType"], entry["AvailabilityZone"])
        if key not in wanted:
            continue
        stamp = entry["Timestamp"]
        if isinstance(stamp, str):
            stamp = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        if key not in newest or stamp > newest[key][0]:
            newest[key] = (stamp, float(entry["SpotPrice"]))
    return {key: price for key, (_, price) in newest.items()}


def _launch_failure(launch: Launch, api: str, err: BotoCoreError | ClientError | str) -> str:
    reason = err if isinstance(err, str) else _error_text(err)
    return _one_line(
        f"{api} {launch.lifecycle} {launch.instance_type} in {launch.zone} failed: {reason}"
    )


def _fleet_refusal(launch: Launch, errors: Sequence[Mapping[str, Any]]) -> ProviderError:
    """The error for an instant fleet that launched nothing (capacity, or a real fault)."""
    if not errors:
        return ProviderError(_launch_failure(launch, "create_fleet", "no instance and no error"))
    reasons = "; ".join(
        f"{error.get('ErrorCode', 'error')}: {error.get('ErrorMessage', '')}".strip()
        for error in errors
    )
    # Only capacity codes mean the placement is full; any other code (bad template, quota,
    # permissions) is a deployment fault the operator has to see, not a zone to avoid.
    codes = [str(error.get("ErrorCode", "")) for error in errors]
    if all(is_capacity_error(code) for code in codes):
        return CapacityRefused(launch, _one_line(reasons))
    return ProviderError(_launch_failure(launch, "create_fleet", reasons))


def _instance_from_description(item: Mapping[str, Any], agent_id: str) -> Instance:
    tags = {str(tag["Key"]): str(tag["Value"]) for tag in item.get("Tags", [])}
    lifecycle: LaunchLifecycle
    # EC2's own field is the truth for spot; the tag covers emulators that do not record it.
    if item.get("InstanceLifecycle") == "spot" or tags.get(LIFECYCLE_TAG) == "spot":
        lifecycle = "spot"
    else:
        lifecycle = "on-demand"
    launch_time = item.get("LaunchTime")
    launched_at = launch_time.timestamp() if isinstance(launch_time, datetime) else 0.0
    return Instance(
        instance_id=str(item["InstanceId"]),
        agent_id=agent_id,
        # An instance of the pool without a model tag is still listed (model ""), so the
        # reaper can see and stop it instead of it running unnoticed.
        model=tags.get(MODEL_TAG, ""),
        lifecycle=lifecycle,
        instance_type=str(item.get("InstanceType", "")),
        zone=str(item.get("Placement", {}).get("AvailabilityZone", "")),
        launched_at=launched_at,
    )
