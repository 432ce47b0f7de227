"""Python values and records to DynamoDB attribute maps, and back."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from spotgate.registry.records import (
    BOOT_PHASES,
    AgentRecord,
    AgentState,
    ApiKeyRecord,
    BootTimeline,
)
from spotgate.registry.schema import feed_shard

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb.type_defs import AttributeValueTypeDef


def encode(value: object) -> AttributeValueTypeDef:
    """One value as a DynamoDB attribute (bool, number, string, string set or map)."""
    if isinstance(value, bool):
        return {"BOOL": value}
    if isinstance(value, int | float):
        return {"N": repr(value)}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, frozenset | set):
        return {"SS": sorted(str(item) for item in value)}
    if isinstance(value, BootTimeline):
        return {"M": {phase: encode(at) for phase, at in value.as_dict().items()}}
    raise TypeError(f"cannot store {type(value).__name__} in DynamoDB")


def encode_item(values: Mapping[str, object]) -> dict[str, AttributeValueTypeDef]:
    """Attribute map of the non-empty values (DynamoDB stores no empty sets, `None` is absent)."""
    return {
        name: encode(value)
        for name, value in values.items()
        if value is not None and value != frozenset()
    }


def decode(attribute: Mapping[str, Any]) -> object:
    """One DynamoDB attribute as a Python value (whole numbers as `int`)."""
    if "S" in attribute:
        return str(attribute["S"])
    if "N" in attribute:
        number = Decimal(attribute["N"])
        return int(number) if number == number.to_integral_value() else float(number)
    if "BOOL" in attribute:
        return bool(attribute["BOOL"])
    if "SS" in attribute:
        return frozenset(attribute["SS"])
    if "M" in attribute:
        return {name: decode(value) for name, value in attribute["M"].items()}
    raise TypeError(f"unexpected DynamoDB attribute {sorted(attribute)}")


def decode_item(item: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """An attribute map as a dict of Python values."""
    return {name: decode(attribute) for name, attribute in item.items()}


def agent_from_item(item: Mapping[str, Mapping[str, Any]]) -> AgentRecord:
    """An `agents` item as a record; attributes the record does not know are ignored."""
    values = decode_item(item)
    values["state"] = AgentState(values["state"])
    for name in ("heartbeat_at", "expires_at", "started_at", "changed_at"):
        values[name] = float(values.get(name, 0.0))
    boot = values.get("boot", {})
    values["boot"] = BootTimeline(
        **{phase: float(boot[phase]) for phase in BOOT_PHASES if phase in boot}
    )
    # An entry written before boots had kinds, or with one unknown here: a cold boot.
    values["boot_kind"] = "warm" if values.get("boot_kind") == "warm" else "cold"
    known = AgentRecord.__dataclass_fields__
    return AgentRecord(**{name: value for name, value in values.items() if name in known})


def agent_to_item(record: AgentRecord) -> dict[str, AttributeValueTypeDef]:
    """A record as an `agents` item, in its change-feed partition."""
    values = {name: getattr(record, name) for name in AgentRecord.__dataclass_fields__}
    return encode_item({**values, "feed": feed_shard(record.agent_id)})


def key_from_item(item: Mapping[str, Mapping[str, Any]]) -> ApiKeyRecord:
    """A `keys` item as a record, without its secret hash."""
    values = decode_item(item)
    values.pop("secret_hash", None)
    known = ApiKeyRecord.__dataclass_fields__
    return ApiKeyRecord(**{name: value for name, value in values.items() if name in known})
