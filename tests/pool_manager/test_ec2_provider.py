"""The ec2 provider against moto's standalone server (real HTTP, real botocore requests)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from botocore.exceptions import ClientError
from structlog.testing import capture_logs

from pool_manager.ec2_api import latest_spot_prices
from pool_manager.ec2_provider import Ec2Provider
from pool_manager.pool_view import Launch, WarmInstance
from pool_manager.provider import (
    CapacityRefused,
    Instance,
    ProviderError,
    StartRefused,
    StoppedInstance,
)
from spotgate.registry import aws_session
from spotgate.settings import Ec2PoolSettings, PoolModel, PoolSettings, SharedSettings
from stack.emulator import AwsEmulator
from tests.support.clocks import FakeClock

POOL = "test-pool"
TEMPLATE = "spotgate-agent-test"
ZONE_A = "us-east-1a"
ZONE_B = "us-east-1b"
GPU_TYPE = "g6.xlarge"
# An Amazon Linux 2 image that moto always carries; asking for it by id spares each test
# the thousands of images that describing every Amazon-owned one returns.
AMAZON_IMAGE = "ami-04681a1dbd79675a5"


@dataclass
class Network:
    """What the pool launches into: two subnets in two zones, and a launch template."""

    subnets: dict[str, str]
    template_id: str
    image_id: str


async def _ec2_call(shared: SharedSettings, method: str, **kwargs: Any) -> Any:
    aws = shared.aws
    async with aws_session(aws).client("ec2", endpoint_url=aws.endpoint_url) as client:
        return await getattr(client, method)(**kwargs)


async def create_network(shared: SharedSettings, zones: tuple[str, ...]) -> Network:
    """A VPC with a subnet in each zone (of the settings' region), and the launch template."""
    aws_ = shared.aws
    async with aws_session(aws_).client("ec2", endpoint_url=aws_.endpoint_url) as ec2:
        images = await ec2.describe_images(Owners=["amazon"], ImageIds=[AMAZON_IMAGE])
        image_id = images["Images"][0]["ImageId"]
        vpc = (await ec2.create_vpc(CidrBlock="10.20.0.0/16"))["Vpc"]["VpcId"]
        subnets = {}
        for index, zone in enumerate(zones):
            subnet = await ec2.create_subnet(
                VpcId=vpc, CidrBlock=f"10.20.{index}.0/24", AvailabilityZone=zone
            )
            subnets[zone] = subnet["Subnet"]["SubnetId"]
        template = await ec2.create_launch_template(
            LaunchTemplateName=TEMPLATE,
            LaunchTemplateData={"ImageId": image_id, "InstanceType": "t3.micro"},
        )
    return Network(subnets, template["LaunchTemplate"]["LaunchTemplateId"], image_id)


@pytest.fixture
async def network(aws: AwsEmulator) -> Network:
    return await create_network(aws.settings(), (ZONE_A, ZONE_B))


def pool_settings(network: Network, shared: SharedSettings, template: str = TEMPLATE):
    return PoolSettings(
        shared=shared,
        provider="ec2",
        ec2=Ec2PoolSettings(pool_name=POOL, launch_template=template, subnets=network.subnets),
    )


class WrappedClient:
    """The real EC2 client with some methods replaced (AWS answers moto cannot give)."""

    def __init__(self, client: Any, **replacements: Callable[..., Any]) -> None:
        self._client = client
        self._replacements = replacements
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        self.calls.append(name)
        if name in self._replacements:
            return self._replacements[name]
        return getattr(self._client, name)


def no_spot_capacity(request: dict[str, Any]) -> dict[str, Any]:
    """What `create_fleet` answers when the request's zone has no spot capacity for its type."""
    return {
        "FleetId": "fleet-00000000-0000-0000-0000-000000000000",
        "Instances": [],
        "Errors": [
            {
                "LaunchTemplateAndOverrides": {
                    "Overrides": request["LaunchTemplateConfigs"][0]["Overrides"][0]
                },
                "Lifecycle": "spot",
                "ErrorCode": "InsufficientInstanceCapacity",
                "ErrorMessage": "There is no Spot capacity available.",
            }
        ],
    }


def client_error(code: str, operation: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": f"{code} (injected)"}}, operation)


@pytest.fixture
async def provider(
    aws: AwsEmulator, network: Network, clock: FakeClock
) -> AsyncIterator[Ec2Provider]:
    shared = aws.settings()
    async with Ec2Provider.open(shared, pool_settings(network, shared), clock=clock) as opened:
        yield opened


async def describe_reservation(shared: SharedSettings, instance_id: str) -> dict[str, Any]:
    answer = await _ec2_call(shared, "describe_instances", InstanceIds=[instance_id])
    reservation: dict[str, Any] = answer["Reservations"][0]
    return reservation


async def describe(shared: SharedSettings, instance_id: str) -> dict[str, Any]:
    instance: dict[str, Any] = (await describe_reservation(shared, instance_id))["Instances"][0]
    return instance


def tags_of(description: dict[str, Any]) -> dict[str, str]:
    return {tag["Key"]: tag["Value"] for tag in description.get("Tags", [])}


async def test_spot_launch_is_tagged_in_requested_subnet(
    aws: AwsEmulator, network: Network, provider: Ec2Provider, clock: FakeClock
) -> None:
    instance = await provider.launch("llama", Launch(GPU_TYPE, ZONE_B, "spot"))

    assert instance.instance_id.startswith("i-")
    # The instance's ARN, as its agent names itself from IMDS and IAM names it in the policy
    # variable its row is held to (${ec2:SourceInstanceARN}): the account from STS, as EC2's.
    shared = aws.settings()
    owner = (await describe_reservation(shared, instance.instance_id))["OwnerId"]
    arn = f"arn:aws:ec2:{shared.aws.region}:{owner}:instance/{instance.instance_id}"
    assert instance.agent_id == arn
    assert (instance.model, instance.lifecycle) == ("llama", "spot")
    assert instance.placement == (GPU_TYPE, ZONE_B)
    assert instance.launched_at == clock.now
    description = await describe(aws.settings(), instance.instance_id)
    assert description["State"]["Name"] in ("pending", "running")
    assert description["SubnetId"] == network.subnets[ZONE_B]
    assert description["Placement"]["AvailabilityZone"] == ZONE_B
    assert description["InstanceType"] == GPU_TYPE
    assert description["ImageId"] == network.image_id  # from the launch template
    assert description.get("InstanceLifecycle") == "spot"  # moto records it
    tags = tags_of(description)
    assert tags["spotgate:pool"] == POOL
    assert tags["spotgate:model"] == "llama"
    assert tags["spotgate:lifecycle"] == "spot"
    assert tags["Name"] == f"{POOL}-llama"


async def test_on_demand_launch_by_template_id(aws: AwsEmulator, network: Network) -> None:
    shared = aws.settings()
    settings = pool_settings(network, shared, template=network.template_id)
    async with Ec2Provider.open(shared, settings) as provider:
        instance = await provider.launch("qwen", Launch(GPU_TYPE, ZONE_A, "on-demand"))
        listed = await provider.instances()

    assert instance.lifecycle == "on-demand"
    description = await describe(shared, instance.instance_id)
    assert "InstanceLifecycle" not in description  # on-demand: EC2 leaves the field out
    assert description["SubnetId"] == network.subnets[ZONE_A]
    assert tags_of(description)["spotgate:lifecycle"] == "on-demand"
    assert [(i.instance_id, i.lifecycle, i.model) for i in listed] == [
        (instance.instance_id, "on-demand", "qwen")
    ]


async def test_each_models_launch_boots_that_model_from_its_own_template(
    aws: AwsEmulator, network: Network
) -> None:
    shared = aws.settings()
    boots = {model: f"SPOTGATE_AGENT_MODEL=org/{model}\n" for model in ("chat", "code")}
    for model, settings in boots.items():
        await _ec2_call(
            shared,
            "create_launch_template",
            LaunchTemplateName=f"{TEMPLATE}-{model}",
            LaunchTemplateData={
                "ImageId": network.image_id,
                "UserData": base64.b64encode(settings.encode()).decode(),
            },
        )
    settings = pool_settings(network, shared).model_copy(
        update={
            "models": tuple(
                PoolModel(name=model, launch_template=f"{TEMPLATE}-{model}") for model in boots
            )
        }
    )
    async with Ec2Provider.open(shared, settings) as provider:
        launched = {
            model: await provider.launch(model, Launch(GPU_TYPE, ZONE_A, lifecycle))
            for model, lifecycle in (("chat", "spot"), ("code", "on-demand"))
        }
    for model, instance in launched.items():
        answer = await _ec2_call(
            shared, "describe_instance_attribute", InstanceId=instance.instance_id,
            Attribute="userData",
        )  # fmt: skip
        user_data = base64.b64decode(answer["UserData"]["Value"]).decode()
        assert user_data == boots[model]
        assert tags_of(await describe(shared, instance.instance_id))["spotgate:model"] == model


async def test_instances_lists_only_the_pool(
    aws: AwsEmulator, network: Network, provider: Ec2Provider
) -> None:
    shared = aws.settings()
    spot = await provider.launch("llama", Launch(GPU_TYPE, ZONE_A, "spot"))
    on_demand = await provider.launch("qwen", Launch(GPU_TYPE, ZONE_B, "on-demand"))
    # Not the pool's: one untagged, one of another pool.
    await _ec2_call(shared, "run_instances", ImageId=network.image_id, MinCount=1, MaxCount=1)
    await _ec2_call(
        shared,
        "run_instances",
        ImageId=network.image_id,
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": "spotgate:pool", "Value": "other"}]}
        ],
    )

    listed = {instance.instance_id: instance for instance in await provider.instances()}

    assert set(listed) == {spot.instance_id, on_demand.instance_id}
    listed_spot = listed[spot.instance_id]
    assert listed_spot == Instance(
        instance_id=spot.instance_id,
        agent_id=spot.agent_id,
        model="llama",
        lifecycle="spot",
        instance_type=GPU_TYPE,
        zone=ZONE_A,
        launched_at=listed_spot.launched_at,
    )
    assert listed_spot.launched_at > 1_600_000_000  # LaunchTime as epoch seconds
    assert listed[on_demand.instance_id].placement == (GPU_TYPE, ZONE_B)
    assert listed[on_demand.instance_id].lifecycle == "on-demand"


async def test_terminate_removes_and_is_idempotent(aws: AwsEmulator, provider: Ec2Provider) -> None:
    kept = await provider.launch("llama", Launch(GPU_TYPE, ZONE_A, "spot"))
    gone = await provider.launch("llama", Launch(GPU_TYPE, ZONE_B, "spot"))

    await provider.terminate(gone.instance_id)

    assert [instance.instance_id for instance in await provider.instances()] == [kept.instance_id]
    description = await describe(aws.settings(), gone.instance_id)
    assert description["State"]["Name"] in ("shutting-down", "terminated")
    await provider.terminate(gone.instance_id)  # twice: no error
    await provider.terminate("i-0123456789abcdef0")  # never existed: no error


async def test_interruption_notice_leaves_the_instance_to_aws(
    provider: Ec2Provider, clock: FakeClock
) -> None:
    instance = await provider.launch("llama", Launch(GPU_TYPE, ZONE_A, "spot"))
    await provider.interruption_noticed(instance.instance_id, clock.now + 120)
    assert [i.instance_id for i in await provider.instances()] == [instance.instance_id]


async def test_terminate_other_errors_are_provider_errors(
    aws: AwsEmulator, network: Network
) -> None:
    shared = aws.settings()

    def wrap(client: Any) -> Any:
        async def terminate_instances(**request: Any) -> Any:
            raise client_error("UnauthorizedOperation", "TerminateInstances")

        return WrappedClient(client, terminate_instances=terminate_instances)

    settings = pool_settings(network, shared)
    async with Ec2Provider.open(shared, settings, wrap_client=wrap) as provider:
        instance = await provider.launch("llama", Launch(GPU_TYPE, ZONE_A, "spot"))
        with pytest.raises(ProviderError, match="UnauthorizedOperation") as failed:
            await provider.terminate(instance.instance_id)
        assert [i.instance_id for i in await provider.instances()] == [instance.instance_id]
    assert f"terminate {instance.instance_id} failed" in str(failed.value)


async def test_fleet_capacity_error_refuses_one_zone_only(
    aws: AwsEmulator, network: Network
) -> None:
    shared = aws.settings()
    subnet_a = network.subnets[ZONE_A]
    requests: list[dict[str, Any]] = []

    def wrap(client: Any) -> Any:
        async def create_fleet(**request: Any) -> Any:
            requests.append(request)
            override = request["LaunchTemplateConfigs"][0]["Overrides"][0]
            if override.get("SubnetId") == subnet_a:
                return no_spot_capacity(request)
            return await client.create_fleet(**request)

        return WrappedClient(client, create_fleet=create_fleet)

    settings = pool_settings(network, shared)
    async with Ec2Provider.open(shared, settings, wrap_client=wrap) as provider:
        launch_a = Launch(GPU_TYPE, ZONE_A, "spot")
        with pytest.raises(CapacityRefused) as refused:
            await provider.launch("llama", launch_a)
        instance = await provider.launch("llama", Launch(GPU_TYPE, ZONE_B, "spot"))
        listed = await provider.instances()

    assert refused.value.launch == launch_a
    assert "InsufficientInstanceCapacity" in refused.value.reason
    assert instance.zone == ZONE_B
    assert [i.instance_id for i in listed] == [instance.instance_id]
    # The request the provider builds: an instant fleet of one, the template, the tags.
    request = requests[1]
    assert request["Type"] == "instant"
    assert request["TargetCapacitySpecification"] == {
        "TotalTargetCapacity": 1,
        "DefaultTargetCapacityType": "spot",
    }
    config = request["LaunchTemplateConfigs"][0]
    # The template's latest version, by number: the instance is tagged with what it boots.
    assert config["LaunchTemplateSpecification"] == {
        "LaunchTemplateId": network.template_id,
        "Version": "1",
    }
    assert config["Overrides"] == [{"InstanceType": GPU_TYPE, "SubnetId": network.subnets[ZONE_B]}]


async def test_fleet_non_capacity_error_is_a_provider_error(
    aws: AwsEmulator, network: Network
) -> None:
    shared = aws.settings()

    def wrap(client: Any) -> Any:
        async def create_fleet(**request: Any) -> Any:
            return {
                "FleetId": "fleet-00000000-0000-0000-0000-000000000000",
                "Instances": [],
                "Errors": [
                    {
                        "ErrorCode": "InvalidLaunchTemplateName.NotFoundException",
                        "ErrorMessage": "The specified launch template does not exist.",
                    }
                ],
            }

        return WrappedClient(client, create_fleet=create_fleet)

    settings = pool_settings(network, shared)
    async with Ec2Provider.open(shared, settings, wrap_client=wrap) as provider:
        with pytest.raises(ProviderError, match="InvalidLaunchTemplateName") as failed:
            await provider.launch("llama", Launch(GPU_TYPE, ZONE_A, "spot"))
    assert not isinstance(failed.value, CapacityRefused)
    assert "\n" not in str(failed.value)


async def test_missing_launch_template_is_a_provider_error(
    aws: AwsEmulator, network: Network
) -> None:
    shared = aws.settings()
    settings = pool_settings(network, shared, template="no-such-template")
    async with Ec2Provider.open(shared, settings) as provider:
        with pytest.raises(ProviderError) as failed:
            await provider.launch("llama", Launch(GPU_TYPE, ZONE_A, "spot"))
        assert await provider.instances() == []
    assert not isinstance(failed.value, CapacityRefused)


async def test_fleet_unsupported_falls_back_to_run_instances(
    aws: AwsEmulator, network: Network
) -> None:
    shared = aws.settings()
    wrapped: list[WrappedClient] = []

    def wrap(client: Any) -> Any:
        async def create_fleet(**request: Any) -> Any:
            raise client_error("UnsupportedOperation", "CreateFleet")

        wrapped.append(WrappedClient(client, create_fleet=create_fleet))
        return wrapped[0]

    settings = pool_settings(network, shared)
    async with Ec2Provider.open(shared, settings, wrap_client=wrap) as provider:
        spot = await provider.launch("llama", Launch(GPU_TYPE, ZONE_B, "spot"))
        on_demand = await provider.launch("llama", Launch(GPU_TYPE, ZONE_A, "on-demand"))
        listed = {instance.instance_id: instance for instance in await provider.instances()}

    assert wrapped[0].calls.count("run_instances") == 2
    assert set(listed) == {spot.instance_id, on_demand.instance_id}
    assert listed[spot.instance_id].lifecycle == "spot"
    assert listed[on_demand.instance_id].lifecycle == "on-demand"
    description = await describe(shared, spot.instance_id)
    assert description["SubnetId"] == network.subnets[ZONE_B]
    assert description["InstanceType"] == GPU_TYPE
    assert description["ImageId"] == network.image_id
    assert description.get("InstanceLifecycle") == "spot"  # from InstanceMarketOptions
    tags = tags_of(description)
    assert tags["aws:ec2launchtemplate:id"] == network.template_id  # EC2 tags it, as AWS does
    assert {key: value for key, value in tags.items() if not key.startswith("aws:")} == {
        "spotgate:pool": POOL,
        "spotgate:model": "llama",
        "spotgate:lifecycle": "spot",
        "Name": f"{POOL}-llama",
        "spotgate:template": f"{network.template_id}:1",
    }
    on_demand_description = await describe(shared, on_demand.instance_id)
    assert "InstanceLifecycle" not in on_demand_description


async def test_run_instances_capacity_error_is_capacity_refused(
    aws: AwsEmulator, network: Network
) -> None:
    shared = aws.settings()

    def wrap(client: Any) -> Any:
        async def create_fleet(**request: Any) -> Any:
            raise client_error("UnsupportedOperation", "CreateFleet")

        async def run_instances(**request: Any) -> Any:
            raise client_error("InsufficientInstanceCapacity", "RunInstances")

        return WrappedClient(client, create_fleet=create_fleet, run_instances=run_instances)

    settings = pool_settings(network, shared)
    launch = Launch(GPU_TYPE, ZONE_A, "spot")
    async with Ec2Provider.open(shared, settings, wrap_client=wrap) as provider:
        with pytest.raises(CapacityRefused) as refused:
            await provider.launch("llama", launch)
        assert await provider.instances() == []
    assert refused.value.launch == launch
    assert "InsufficientInstanceCapacity" in refused.value.reason


async def test_spot_prices_are_read_from_the_price_history(provider: Ec2Provider) -> None:
    wanted = [(GPU_TYPE, ZONE_A), (GPU_TYPE, ZONE_B), (GPU_TYPE, "us-east-9z")]
    prices = await provider.spot_prices(wanted)
    assert set(prices) == {(GPU_TYPE, ZONE_A), (GPU_TYPE, ZONE_B)}  # no such zone: none
    assert all(price > 0 for price in prices.values())
    assert await provider.spot_prices([]) == {}


def test_the_newest_price_of_each_placement_wins() -> None:
    history = [
        {"InstanceType": GPU_TYPE, "AvailabilityZone": ZONE_A, "SpotPrice": "0.31",
         "Timestamp": datetime(2026, 11, 24, 10, tzinfo=UTC)},
        {"InstanceType": GPU_TYPE, "AvailabilityZone": ZONE_A, "SpotPrice": "0.29",
         "Timestamp": datetime(2026, 11, 24, 11, tzinfo=UTC)},
        {"InstanceType": GPU_TYPE, "AvailabilityZone": ZONE_B, "SpotPrice": "0.40",
         "Timestamp": "2026-11-24T09:00:00.000Z"},
        {"InstanceType": "p5.48xlarge", "AvailabilityZone": ZONE_A, "SpotPrice": "30",
         "Timestamp": "2026-11-24T11:00:00Z"},
    ]  # fmt: skip
    wanted = {(GPU_TYPE, ZONE_A), (GPU_TYPE, ZONE_B)}
    assert latest_spot_prices(history, wanted) == {
        (GPU_TYPE, ZONE_A): 0.29,
        (GPU_TYPE, ZONE_B): 0.40,
    }


async def test_an_unreadable_price_history_is_a_provider_error(
    aws: AwsEmulator, network: Network
) -> None:
    shared = aws.settings()

    def wrap(client: Any) -> Any:
        async def describe_spot_price_history(**request: Any) -> Any:
            raise client_error("RequestLimitExceeded", "DescribeSpotPriceHistory")

        return WrappedClient(client, describe_spot_price_history=describe_spot_price_history)

    settings = pool_settings(network, shared)
    async with Ec2Provider.open(shared, settings, wrap_client=wrap) as provider:
        with pytest.raises(ProviderError, match="RequestLimitExceeded"):
            await provider.spot_prices([(GPU_TYPE, ZONE_A)])


async def test_an_instance_stopped_into_the_warm_pool_starts_again_as_a_warm_boot(
    aws: AwsEmulator, network: Network, provider: Ec2Provider, clock: FakeClock
) -> None:
    shared = aws.settings()
    launched = await provider.launch("llama", Launch(GPU_TYPE, ZONE_A, "on-demand", True))
    assert launched.for_warm_pool
    assert tags_of(await describe(shared, launched.instance_id))["spotgate:warm-pool"] == "true"
    (listed,) = await provider.instances()
    assert (listed.boot, listed.for_warm_pool) == ("cold", True)
    # Another pool's stopped instance is none of ours.
    other = await _ec2_call(
        shared, "run_instances", ImageId=network.image_id, MinCount=1, MaxCount=1,
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": "spotgate:pool", "Value": "other"}]}
        ],
    )  # fmt: skip
    await _ec2_call(shared, "stop_instances", InstanceIds=[other["Instances"][0]["InstanceId"]])

    clock.advance(600)
    await provider.stop(launched.instance_id)

    assert await provider.instances() == []
    (stopped,) = await provider.stopped()
    assert stopped == StoppedInstance(
        instance_id=launched.instance_id,
        agent_id=launched.agent_id,
        model="llama",
        instance_type=GPU_TYPE,
        zone=ZONE_A,
        stopped_at=clock.now,
    )
    assert stopped.warm() == WarmInstance(launched.instance_id, GPU_TYPE, ZONE_A, clock.now)
    assert (await describe(shared, launched.instance_id))["State"]["Name"] == "stopped"

    clock.advance(3600)
    started = await provider.start(stopped)

    assert await provider.stopped() == []
    assert await provider.instances() == [started]
    assert (started.instance_id, started.agent_id) == (launched.instance_id, launched.agent_id)
    assert (started.boot, started.for_warm_pool) == ("warm", False)  # it serves now
    assert started.launched_at == clock.now  # this boot's start, not the first launch
    assert (started.lifecycle, started.model, started.placement) == (
        "on-demand", "llama", (GPU_TYPE, ZONE_A),
    )  # fmt: skip

    await provider.stop(started.instance_id)
    await provider.terminate(started.instance_id)  # a stopped instance ends as a running one
    assert await provider.stopped() == []
    assert (await describe(shared, started.instance_id))["State"]["Name"] in (
        "shutting-down", "terminated",
    )  # fmt: skip


async def test_a_warm_instance_launched_before_its_template_changed_is_stale(
    aws: AwsEmulator, network: Network, provider: Ec2Provider
) -> None:
    shared = aws.settings()
    before = await provider.launch("llama", Launch(GPU_TYPE, ZONE_A, "on-demand"))
    await provider.stop(before.instance_id)
    assert [s.stale for s in await provider.stopped()] == [False]
    booted = tags_of(await describe(shared, before.instance_id))["spotgate:template"]
    assert booted == f"{network.template_id}:1"  # the version it booted, as the launch named it

    # A deploy: the template's new version boots another image (or agent settings).
    await _ec2_call(
        shared, "create_launch_template_version", LaunchTemplateName=TEMPLATE,
        LaunchTemplateData={"ImageId": network.image_id, "InstanceType": "t3.small"},
    )  # fmt: skip
    after = await provider.launch("llama", Launch(GPU_TYPE, ZONE_A, "on-demand"))
    await provider.stop(after.instance_id)

    stale = {s.instance_id: s.stale for s in await provider.stopped()}
    assert stale == {before.instance_id: True, after.instance_id: False}
    (old,) = [s for s in await provider.stopped() if s.instance_id == before.instance_id]
    assert old.warm().stale  # the policy terminates it, never starts it


async def test_a_template_that_cannot_be_read_leaves_the_warm_pool_as_it_is(
    aws: AwsEmulator, network: Network
) -> None:
    shared = aws.settings()
    readable = True

    def wrap(client: Any) -> Any:
        async def describe_launch_templates(**request: Any) -> Any:
            if readable:
                return await client.describe_launch_templates(**request)
            raise client_error("UnauthorizedOperation", "DescribeLaunchTemplates")

        return WrappedClient(client, describe_launch_templates=describe_launch_templates)

    settings = pool_settings(network, shared)
    async with Ec2Provider.open(shared, settings, wrap_client=wrap) as provider:
        instance = await provider.launch("llama", Launch(GPU_TYPE, ZONE_A, "on-demand"))
        await provider.stop(instance.instance_id)
        await _ec2_call(
            shared, "create_launch_template_version", LaunchTemplateName=TEMPLATE,
            LaunchTemplateData={"ImageId": network.image_id},
        )  # fmt: skip
        readable = False
        with capture_logs() as logs:
            assert [s.stale for s in await provider.stopped()] == [False]  # unknown: not stale
            # A launch still boots the template's latest version, untagged.
            untagged = await provider.launch("llama", Launch(GPU_TYPE, ZONE_A, "on-demand"))
    (warning, _) = [log for log in logs if log["log_level"] == "warning"]
    assert warning["event"] == "launch template unreadable: its latest version is not known"
    assert "UnauthorizedOperation" in warning["error"]
    assert "spotgate:template" not in tags_of(await describe(shared, untagged.instance_id))


async def test_a_warm_start_refused_for_capacity_says_so(
    aws: AwsEmulator, network: Network
) -> None:
    shared = aws.settings()

    def wrap(client: Any) -> Any:
        async def start_instances(**request: Any) -> Any:
            raise client_error("InsufficientInstanceCapacity", "StartInstances")

        return WrappedClient(client, start_instances=start_instances)

    settings = pool_settings(network, shared)
    async with Ec2Provider.open(shared, settings, wrap_client=wrap) as provider:
        instance = await provider.launch("llama", Launch(GPU_TYPE, ZONE_A, "on-demand"))
        await provider.stop(instance.instance_id)
        (stopped,) = await provider.stopped()
        with pytest.raises(StartRefused, match="InsufficientInstanceCapacity") as refused:
            await provider.start(stopped)
        assert [i.instance_id for i in await provider.stopped()] == [instance.instance_id]
    assert f"start {instance.instance_id} failed" in str(refused.value)
