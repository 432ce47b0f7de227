from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError
from pydantic_settings import BaseSettings

from spotgate.settings import (
    AgentSettings,
    AwsSettings,
    Ec2PoolSettings,
    GatewaySettings,
    LocalPoolSettings,
    Placement,
    PoolSettings,
    SharedSettings,
    SocketLimits,
    SyntheticSettings,
    TokenSettings,
    describe_validation_error,
    emulator_settings,
    model_store_aws,
    settings_env,
)


def test_defaults_follow_the_design() -> None:
    gateway = GatewaySettings()
    assert gateway.shared.tables.agents == "spotgate-agents"
    assert gateway.token.ttl_seconds == 60
    assert gateway.limits.max_frame_bytes == 64 * 1024
    assert gateway.compress is False
    assert gateway.registry_refresh_seconds <= 1.0
    assert AgentSettings().imds_poll_seconds == 5.0


def test_environment_with_prefixes_and_nesting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPOTGATE_AWS__ENDPOINT_URL", "http://127.0.0.1:5000")
    monkeypatch.setenv("SPOTGATE_TABLES__KEYS", "k2")
    monkeypatch.setenv("SPOTGATE_GATEWAY_PORT", "9000")
    monkeypatch.setenv("SPOTGATE_GATEWAY_LIMITS__MAX_FRAME_BYTES", "1024")
    monkeypatch.setenv("SPOTGATE_GATEWAY_ALLOWED_ORIGINS", '["https://chat.example"]')
    monkeypatch.setenv("SPOTGATE_GATEWAY_ROUTING__SHARED_PROMPT_SHA256", f'["{"ab" * 32}"]')
    monkeypatch.setenv("SPOTGATE_AGENT_VLLM__MAX_NUM_SEQS", "8")
    monkeypatch.setenv(
        "SPOTGATE_POOL_PLACEMENTS",
        '[{"instance_type":"g6.xlarge","zone":"a",'
        '"spot_price_per_hour":0.3,"on_demand_price_per_hour":0.8}]',
    )

    gateway, agent, pool = GatewaySettings(), AgentSettings(), PoolSettings()

    assert gateway.shared.aws.endpoint_url == "http://127.0.0.1:5000"
    assert SharedSettings().tables.keys == "k2"
    assert gateway.port == 9000
    assert gateway.limits.max_frame_bytes == 1024
    assert gateway.allowed_origins == ("https://chat.example",)
    assert gateway.routing.shared_prompt_sha256 == ("ab" * 32,)
    assert agent.vllm.max_num_seqs == 8
    assert pool.placements[0].instance_type == "g6.xlarge"


@pytest.mark.parametrize(
    ("variable", "value", "field"),
    [
        ("SPOTGATE_GATEWAY_LIMITS__IDLE_TIMEOUT_SECONDS", "-1", "idle_timeout_seconds"),
        ("SPOTGATE_GATEWAY_TOKEN__TTL_SECONDS", "3600", "ttl_seconds"),
        ("SPOTGATE_GATEWAY_REGISTRY_REFRESH_SECONDS", "5", "registry_refresh_seconds"),
        ("SPOTGATE_GATEWAY_PORT", "http", "port"),
        ("SPOTGATE_GATEWAY_LIMITS__MAX_FRAMES", "3", "max_frames"),
        # A digest, not the prompt's text: what the operator meant is not guessed at.
        ("SPOTGATE_GATEWAY_ROUTING__SHARED_PROMPT_SHA256", '["Be brief."]', "shared_prompt_sha256"),
    ],
)
def test_bad_values_fail_with_the_field_named(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, field: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError) as caught:
        GatewaySettings()
    line = describe_validation_error(caught.value)
    assert field in line
    assert "\n" not in line


def test_max_below_min_is_refused() -> None:
    with pytest.raises(ValidationError, match="max_agents"):
        PoolSettings(min_agents=5, max_agents=2)


def gpu_in(zone: str) -> Placement:
    return Placement(
        instance_type="g6.xlarge", zone=zone, spot_price_per_hour=0.4, on_demand_price_per_hour=1.0
    )


@pytest.mark.parametrize(
    ("settings", "line"),
    [
        ({"regions": ("us-east-1", "us-west-9")}, "no EC2 region is called us-west-9"),
        ({"regions": ("us-east-1", "us-east-1")}, "each region once"),
        (
            {"regions": ("us-east-1",), "placements": (gpu_in("us-west-2a"),)},
            "zone us-west-2a is in us-west-2, not in the pool's regions (us-east-1)",
        ),
        (
            {"regions": ("us-east-1",), "ec2": {"subnets": {"eu-west-1a": "subnet-1"}}},
            "zone eu-west-1a is in eu-west-1, not in the pool's regions (us-east-1)",
        ),
    ],
)
def test_a_region_or_zone_outside_the_pools_regions_is_refused_naming_it(
    settings: dict[str, Any], line: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        PoolSettings(**settings)
    assert line in describe_validation_error(caught.value)


@pytest.mark.parametrize(
    ("settings", "regions"),
    [
        ({}, ("us-east-1",)),  # none placed: the home region's
        ({"placements": (gpu_in("us-west-2b"), gpu_in("us-east-2a"))}, ("us-east-2", "us-west-2")),
        (
            {"regions": ("us-west-2", "us-east-1"), "placements": (gpu_in("us-east-1a"),)},
            ("us-west-2", "us-east-1"),
        ),
    ],
)
def test_the_pool_places_in_its_regions_or_those_of_its_placements(
    settings: dict[str, Any], regions: tuple[str, ...]
) -> None:
    assert PoolSettings(**settings).pool_regions == regions


def test_heartbeat_must_be_shorter_than_the_agent_ttl() -> None:
    with pytest.raises(ValidationError, match="heartbeat_seconds"):
        AgentSettings(heartbeat_seconds=30)


def test_only_one_signing_key_source() -> None:
    with pytest.raises(ValidationError, match="only one"):
        GatewaySettings.model_validate(
            {"token": {"signing_key_file": "/k.pem", "signing_key_secret_id": "arn"}}
        )


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.5", "gateway.example"])  # noqa: S104
def test_the_chat_dev_key_is_refused_on_any_bind_but_loopback(host: str) -> None:
    with pytest.raises(ValidationError, match="loopback only"):
        GatewaySettings(host=host, chat_dev_api_key="sg-abc-def")  # type: ignore[arg-type]
    assert GatewaySettings(host="127.0.0.1", chat_dev_api_key="sg-abc-def")  # type: ignore[arg-type]


def test_secret_settings_do_not_print(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPOTGATE_GATEWAY_TOKEN__SIGNING_KEY_PEM", "-----BEGIN PRIVATE KEY-----xyz")
    monkeypatch.setenv("SPOTGATE_AWS__SECRET_ACCESS_KEY", "hunter2")
    gateway = GatewaySettings()
    assert "xyz" not in repr(gateway)
    assert "hunter2" not in repr(gateway)
    assert gateway.token.signing_key_pem is not None
    assert gateway.token.signing_key_pem.get_secret_value().endswith("xyz")


SETTINGS_OF_A_STACK = [
    pytest.param(
        GatewaySettings(
            shared=emulator_settings("http://127.0.0.1:5000", "eu-west-1"),
            port=9001,
            public_url="http://gw.example",
            token=TokenSettings(signing_key_pem=SecretStr("-----PEM-----\nkey\n"), ttl_seconds=9),
            limits=SocketLimits(max_frame_bytes=1024),
            models=("a", "b"),
            allowed_origins=("https://chat.example",),
            compress=True,
            chat_dev_api_key=SecretStr("sg-1-2"),
        ),
        id="gateway: secrets, nested sections, tuples, booleans",
    ),
    pytest.param(
        AgentSettings(
            shared=SharedSettings(log_level="debug", log_format="json"),
            engine="synthetic",
            port=0,
            heartbeat_seconds=0.5,
            synthetic=SyntheticSettings(tokens_per_second=40.5, echo=True),
            jwks_url=None,
        ),
        id="agent: floats, a None left to the default",
    ),
    pytest.param(
        PoolSettings(
            min_agents=2,
            placements=(Placement(instance_type="g5", zone="z", spot_price_per_hour=0.4,
                                  on_demand_price_per_hour=1.0),),
            local=LocalPoolSettings(agent_env={"SPOTGATE_AGENT_HEARTBEAT_SECONDS": "1"}),
        ),
        id="pool: a tuple of sections, a dict",
    ),
    pytest.param(
        PoolSettings(provider="ec2", regions=("us-west-2", "us-east-1"),
                     ec2=Ec2PoolSettings(subnets={"us-west-2a": "subnet-1"})),
        id="pool: regions",
    ),
]  # fmt: skip


@pytest.mark.parametrize("settings", SETTINGS_OF_A_STACK)
def test_a_child_reads_back_exactly_the_settings_its_environment_was_derived_from(
    settings: BaseSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable, value in settings_env(settings).items():
        monkeypatch.setenv(variable, value)
    read_back = type(settings)()
    assert read_back.model_dump() == settings.model_dump()
    secrets = (
        [settings.token.signing_key_pem, settings.chat_dev_api_key]
        if isinstance(settings, GatewaySettings)
        else []
    )
    for secret in secrets:
        assert secret is not None
        assert secret.get_secret_value() in settings_env(settings).values()


def test_only_what_was_set_is_written() -> None:
    env = settings_env(GatewaySettings(port=9001, limits=SocketLimits(max_frame_bytes=1024)))
    assert env == {
        "SPOTGATE_GATEWAY_PORT": "9001",
        "SPOTGATE_GATEWAY_LIMITS__MAX_FRAME_BYTES": "1024",
    }


@pytest.mark.parametrize(
    "make",
    [
        lambda: AgentSettings(served_model_name="qwen3:8b"),
        lambda: GatewaySettings(models=("tiny", "qwen3:8b")),
        lambda: PoolSettings(models=("qwen3:8b",)),
    ],
    ids=["agent", "gateway", "pool"],
)
def test_a_served_name_with_the_adapter_separator_is_refused_naming_why(make: Any) -> None:
    with pytest.raises(ValidationError, match="a served model's name has no ':'"):
        make()


def test_the_pools_defaults_read_no_environment() -> None:
    # Built at import: a value in the environment, good or bad, is for the command that reads
    # the settings (which reports a bad one in one line), never for the defaults.
    for ttl in ("7", "-5"):
        shown = subprocess.run(
            [sys.executable, "-c", DEFAULT_TTL_SCRIPT],
            env={**os.environ, "SPOTGATE_REGISTRY__AGENT_TTL_SECONDS": ttl},
            capture_output=True,
            text=True,
            check=True,
        )
        assert shown.stdout.strip() == "30.0"


DEFAULT_TTL_SCRIPT = (
    "from spotgate.settings import POOL_DEFAULTS; "
    "print(POOL_DEFAULTS.shared.registry.agent_ttl_seconds)"
)


def test_a_staged_model_is_read_in_its_buckets_region_the_registry_at_home() -> None:
    home = SharedSettings().model_copy(update={"aws": AwsSettings(region="us-east-1")})
    agent = AgentSettings(shared=home, model_region="us-west-2")
    assert model_store_aws(agent).region == "us-west-2"
    assert agent.shared.aws.region == "us-east-1"  # the registry's, the gateways' keys'
    assert model_store_aws(AgentSettings(shared=home)) == home.aws
