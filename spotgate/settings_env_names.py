"""The environment variable names of the typed settings, made from the classes themselves.

A setting's variable is its class's prefix, then the path to the field in capitals, nested
sections joined by the classes' nested delimiter (`GatewaySettings`, `limit_store.url` →
`SPOTGATE_GATEWAY_LIMIT_STORE__URL`). What writes a service's environment by hand (the CDK
app) names fields through `env_name`, so a name the settings lack fails where it is written,
and `setting_of` reads a name back to the field it sets.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_settings import BaseSettings

from spotgate.settings import AgentSettings, GatewaySettings, PoolSettings, SharedSettings

SETTINGS_CLASSES: tuple[type[BaseSettings], ...] = (
    SharedSettings,
    GatewaySettings,
    AgentSettings,
    PoolSettings,
)
"""Every class a service reads its settings from, each under its own prefix."""

Value = TypeVar("Value")


class UnknownSetting(KeyError):
    """A field path that names no field of the settings class."""


def env_prefix(settings: type[BaseSettings]) -> str:
    """The prefix of every variable `settings` reads (`SPOTGATE_AGENT_`)."""
    return str(settings.model_config.get("env_prefix", "")).upper()


def _delimiter(settings: type[BaseSettings]) -> str:
    return str(settings.model_config.get("env_nested_delimiter") or "__")


def _section(annotation: Any) -> type[BaseModel] | None:
    """The settings section a field holds (`X` or `X | None`), if it holds one."""
    if isinstance(annotation, type):
        return annotation if issubclass(annotation, BaseModel) else None
    if get_origin(annotation) in (Union, types.UnionType):
        sections = [section for arg in get_args(annotation) if (section := _section(arg))]
        return sections[0] if len(sections) == 1 else None
    return None


def _is_field(settings: type[BaseSettings], path: list[str]) -> bool:
    model: type[BaseModel] | None = settings
    for name in path:
        field = model.model_fields.get(name) if model is not None else None
        if field is None:
            return False
        model = _section(field.annotation)
    return True


def env_name(settings: type[BaseSettings], field_path: str) -> str:
    """The variable that sets `settings`' field at the dotted `field_path` (`limit_store.url`)."""
    path = field_path.split(".")
    if not _is_field(settings, path):
        raise UnknownSetting(f"{settings.__name__} has no setting {field_path}")
    return env_prefix(settings) + _delimiter(settings).join(path).upper()


def env_names(settings: type[BaseSettings], values: Mapping[str, Value]) -> dict[str, Value]:
    """`values` keyed by dotted field paths of `settings`, keyed by their variables instead."""
    return {env_name(settings, field_path): value for field_path, value in values.items()}


def setting_of(variable: str) -> tuple[type[BaseSettings], str] | None:
    """The settings class and dotted field path that `variable` sets, or None if it sets none."""
    name = variable.upper()  # the settings read their variables case-insensitively
    # The longest prefix first: `SPOTGATE_GATEWAY_…` is the gateway's, not a shared setting.
    for settings in sorted(SETTINGS_CLASSES, key=lambda cls: -len(env_prefix(cls))):
        prefix = env_prefix(settings)
        path = name.removeprefix(prefix).lower().split(_delimiter(settings))
        if name.startswith(prefix) and _is_field(settings, path):
            return settings, ".".join(path)
    return None
