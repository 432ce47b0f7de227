"""Environment variable names made from the typed settings, and read back to their fields."""

from __future__ import annotations

import pytest
from pydantic_settings import BaseSettings

from spotgate.settings import AgentSettings, GatewaySettings, PoolSettings, SharedSettings
from spotgate.settings_env_names import UnknownSetting, env_name, env_names, setting_of


@pytest.mark.parametrize(
    ("settings", "field_path", "variable"),
    [
        (SharedSettings, "log_format", "SPOTGATE_LOG_FORMAT"),
        (SharedSettings, "aws.region", "SPOTGATE_AWS__REGION"),
        (GatewaySettings, "port", "SPOTGATE_GATEWAY_PORT"),
        (GatewaySettings, "limit_store.url", "SPOTGATE_GATEWAY_LIMIT_STORE__URL"),
        (AgentSettings, "vllm.max_model_len", "SPOTGATE_AGENT_VLLM__MAX_MODEL_LEN"),
        (PoolSettings, "ec2.subnets", "SPOTGATE_POOL_EC2__SUBNETS"),
    ],
)
def test_a_field_path_names_its_variable_and_back(
    settings: type[BaseSettings], field_path: str, variable: str
) -> None:
    assert env_name(settings, field_path) == variable
    assert setting_of(variable) == (settings, field_path)


@pytest.mark.parametrize(
    ("settings", "field_path"),
    [
        (GatewaySettings, "no_such_port"),
        (GatewaySettings, "limit_store.no_such"),
        (GatewaySettings, "port.more"),  # past a plain value
        (AgentSettings, "log_format"),  # a shared setting, not the agent's own
    ],
)
def test_a_path_that_is_no_field_is_refused(settings: type[BaseSettings], field_path: str) -> None:
    with pytest.raises(UnknownSetting, match=field_path):
        env_name(settings, field_path)


@pytest.mark.parametrize(
    "variable",
    [
        "SPOTGATE_GATEWAY_NO_SUCH",
        "SPOTGATE_AGENT_VLLM__NO_SUCH",
        "SPOTGATE_AGENT_LOG_FORMAT",
        "SPOTGATE_POOL_PORT__MORE",
        "OTHER_PORT",
    ],
)
def test_a_variable_no_settings_read_sets_nothing(variable: str) -> None:
    assert setting_of(variable) is None


def test_a_variable_is_read_case_insensitively_as_the_settings_read_it() -> None:
    assert setting_of("spotgate_gateway_port") == (GatewaySettings, "port")


def test_values_by_field_path_are_keyed_by_their_variables() -> None:
    assert env_names(GatewaySettings, {"host": "gateway.internal", "token.ttl_seconds": "30"}) == {
        "SPOTGATE_GATEWAY_HOST": "gateway.internal",
        "SPOTGATE_GATEWAY_TOKEN__TTL_SECONDS": "30",
    }


def test_the_settings_read_the_variable_a_name_is_made_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(env_name(GatewaySettings, "limit_store.url"), "redis://cache:6379")
    monkeypatch.setenv(env_name(SharedSettings, "aws.region"), "eu-west-1")
    monkeypatch.setenv(env_name(AgentSettings, "vllm.max_model_len"), "1024")
    url = GatewaySettings().limit_store.url
    assert url is not None
    assert url.get_secret_value() == "redis://cache:6379"
    assert GatewaySettings().shared.aws.region == "eu-west-1"
    assert AgentSettings().vllm.max_model_len == 1024
