"""Typed settings to a child's environment, and a validation error to one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    SecretStr,
    ValidationError,
)
from pydantic_settings import BaseSettings


def settings_env(settings: BaseSettings) -> dict[str, str]:
    """Environment variables that give a child process these settings.

    Every field set explicitly (or read from this process's environment) is written, nested
    sections with `__`, the shared settings under their own prefix; defaults are left to the
    child. So a stack is described once, as typed settings, and a new setting needs no code
    here. Secrets are written in clear: the child's environment is where they go.
    """
    config = settings.model_config
    prefix = str(config.get("env_prefix", ""))
    delimiter = str(config.get("env_nested_delimiter") or "__")
    env: dict[str, str] = {}
    for name in sorted(settings.model_fields_set):
        value = getattr(settings, name)
        if isinstance(value, BaseSettings):
            env.update(settings_env(value))
        else:
            _section_env(f"{prefix}{name}".upper(), value, delimiter, env)
    return env


def _section_env(variable: str, value: Any, delimiter: str, env: dict[str, str]) -> None:
    if isinstance(value, BaseModel):
        for name in sorted(value.model_fields_set):
            _section_env(
                f"{variable}{delimiter}{name.upper()}", getattr(value, name), delimiter, env
            )
    elif value is not None:  # unset is the only None a field takes from the environment
        plain = _plain(value)
        # Text as it is; numbers, booleans, tuples, lists and dicts as JSON, which
        # pydantic-settings reads back.
        env[variable] = plain if isinstance(plain, str) else json.dumps(plain)


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return {name: _plain(getattr(value, name)) for name in value.model_fields_set}
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    return value


def describe_validation_error(err: ValidationError) -> str:
    """Render a settings validation error as one line: `field: problem; field: problem`."""
    parts = []
    for problem in err.errors(include_url=False):
        where = ".".join(str(part) for part in problem["loc"]) or err.title
        parts.append(f"{where}: {problem['msg']}")
    return f"invalid {err.title} — " + "; ".join(parts)
