"""What EC2's answers mean to the pool: tags, error codes, descriptions, spot prices.

Pure: they are read into the provider's plain data here; `ec2_provider.py` makes the calls.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from pool_manager.pool_view import Launch, LaunchLifecycle, PlacementKey
from pool_manager.provider import CapacityRefused, Instance, ProviderError, StoppedInstance
from spotgate.logging import one_line
from spotgate.registry import BootKind

POOL_TAG = "spotgate:pool"
MODEL_TAG = "spotgate:model"
LIFECYCLE_TAG = "spotgate:lifecycle"
NAME_TAG = "Name"
WARM_POOL_TAG = "spotgate:warm-pool"  # "true": launched to boot once, then be stopped
BOOT_TAG = "spotgate:boot"  # "warm" once started again from the warm pool
STARTED_AT_TAG = "spotgate:started-at"  # epoch seconds of its last start from the warm pool
STOPPED_AT_TAG = "spotgate:stopped-at"  # epoch seconds of its last stop into the warm pool
# The launch template version it booted ("<id>:<version>"), as the launch resolved it.
TEMPLATE_TAG = "spotgate:template"

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


def error_code(err: ClientError) -> str:
    """The code of an EC2 error."""
    return str(err.response.get("Error", {}).get("Code", ""))


def error_text(err: BotoCoreError | ClientError) -> str:
    """An EC2 or botocore error as `Code: message`."""
    if isinstance(err, ClientError):
        error = err.response.get("Error", {})
        return f"{error.get('Code', 'error')}: {error.get('Message', '')}".strip()
    return str(err)


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


def launch_failure(launch: Launch, api: str, err: BotoCoreError | ClientError | str) -> str:
    """One line saying which launch failed, through which call, and why."""
    reason = err if isinstance(err, str) else error_text(err)
    return one_line(
        f"{api} {launch.lifecycle} {launch.instance_type} in {launch.zone} failed: {reason}"
    )


def fleet_refusal(launch: Launch, errors: Sequence[Mapping[str, Any]]) -> ProviderError:
    """The error for an instant fleet that launched nothing (capacity, or a real fault)."""
    if not errors:
        return ProviderError(launch_failure(launch, "create_fleet", "no instance and no error"))
    reasons = "; ".join(
        f"{error.get('ErrorCode', 'error')}: {error.get('ErrorMessage', '')}".strip()
        for error in errors
    )
    # Only capacity codes mean the placement is full; any other code (bad template, quota,
    # permissions) is a deployment fault the operator has to see, not a zone to avoid.
    codes = [str(error.get("ErrorCode", "")) for error in errors]
    if all(is_capacity_error(code) for code in codes):
        return CapacityRefused(launch, one_line(reasons))
    return ProviderError(launch_failure(launch, "create_fleet", reasons))


def tags_of(item: Mapping[str, Any]) -> dict[str, str]:
    """An EC2 description's tags as a dict."""
    return {str(tag["Key"]): str(tag["Value"]) for tag in item.get("Tags", [])}


def tagged_seconds(tags: Mapping[str, str], key: str) -> float:
    """Epoch seconds the provider tagged the instance with (0: none, or unreadable)."""
    try:
        return float(tags.get(key, "0"))
    except ValueError:
        return 0.0


def launch_seconds(item: Mapping[str, Any]) -> float:
    """Epoch seconds of the instance's `LaunchTime` (0: none)."""
    launch_time = item.get("LaunchTime")
    return launch_time.timestamp() if isinstance(launch_time, datetime) else 0.0


def instance_from_description(item: Mapping[str, Any], agent_id: str) -> Instance:
    """A running instance of the pool, from its EC2 description."""
    tags = tags_of(item)
    lifecycle: LaunchLifecycle
    # EC2's own field is the truth for spot; the tag covers emulators that do not record it.
    if item.get("InstanceLifecycle") == "spot" or tags.get(LIFECYCLE_TAG) == "spot":
        lifecycle = "spot"
    else:
        lifecycle = "on-demand"
    boot: BootKind = "warm" if tags.get(BOOT_TAG) == "warm" else "cold"
    return Instance(
        instance_id=str(item["InstanceId"]),
        agent_id=agent_id,
        # An instance of the pool without a model tag is still listed (model ""), so the
        # reaper can see and stop it instead of it running unnoticed.
        model=tags.get(MODEL_TAG, ""),
        lifecycle=lifecycle,
        instance_type=str(item.get("InstanceType", "")),
        zone=str(item.get("Placement", {}).get("AvailabilityZone", "")),
        # This boot's start: EC2 moves `LaunchTime` to a restart, an emulator may not.
        launched_at=max(launch_seconds(item), tagged_seconds(tags, STARTED_AT_TAG)),
        boot=boot,
        for_warm_pool=boot == "cold" and tags.get(WARM_POOL_TAG) == "true",
    )


def stopped_from_description(
    item: Mapping[str, Any], agent_id: str, stale: bool
) -> StoppedInstance:
    """A stopped (or stopping) instance of the warm pool, from its EC2 description."""
    tags = tags_of(item)
    return StoppedInstance(
        instance_id=str(item["InstanceId"]),
        agent_id=agent_id,
        model=tags.get(MODEL_TAG, ""),
        instance_type=str(item.get("InstanceType", "")),
        zone=str(item.get("Placement", {}).get("AvailabilityZone", "")),
        # Stopped by hand (no tag): it has been stopped at least since it last started.
        stopped_at=tagged_seconds(tags, STOPPED_AT_TAG) or launch_seconds(item),
        stopping=item.get("State", {}).get("Name") == "stopping",
        stale=stale,
    )
