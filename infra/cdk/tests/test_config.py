"""Context values that cannot deploy are refused with one line naming the key."""

from __future__ import annotations

import json
import re
from typing import Any

import aws_cdk as cdk
import pytest
from stacks.common import retention
from stacks.config import DEFAULT_MODEL, ConfigError, DeployConfig, ModelConfig
from stacks.context import MOVED_KEYS, config_as_context, config_from_context
from stacks.pool_manager_service import pool_models_json


def _config(context: dict[str, Any]) -> DeployConfig:
    return config_from_context(cdk.App(context=context).node)


def _plain(context: dict[str, Any]) -> DeployConfig:
    """`_config` for a stack that may listen on plain HTTP: the other checks' turn."""
    return _config({"allowPlainHttp": True, **context})


def test_no_context_gives_the_defaults_which_need_a_certificate() -> None:
    with pytest.raises(ConfigError, match=r"^certificateArn: the gateway serves HTTPS only"):
        _config({})
    assert _config({"allowPlainHttp": True}) == DeployConfig(allow_plain_http=True)
    certificate = "arn:aws:acm:us-east-1:123456789012:certificate/0"
    assert _config({"certificateArn": certificate}).https


@pytest.mark.parametrize(
    ("context", "key"),
    [
        ({"maxAzs": 1}, "maxAzs"),
        ({"availabilityZones": ["us-east-1a"]}, "availabilityZones"),
        ({"gatewayDrainSeconds": 110}, "gatewayDrainSeconds"),
        ({"albIdleTimeoutSeconds": 5000}, "albIdleTimeoutSeconds"),
        ({"agentSettings": {"SPOTGATE_POOL_MIN_AGENTS": "1"}}, "agentSettings"),
        ({"instanceTypes": [{"instanceType": "g5.xlarge"}]}, "instanceTypes"),
        ({"instanceTypes": []}, "instanceTypes"),
        ({"onDemandFallback": "yes"}, "onDemandFallback"),
        ({"poolName": "my pool"}, "poolName"),
        ({"rootVolumeGiB": 0}, "rootVolumeGiB"),
        ({"agentSettings": {"SPOTGATE_AGENT_MODEL": "a\nb"}}, "agentSettings"),
        # What a model entry sets is its own: the pool-wide settings cannot override it.
        ({"agentSettings": {"SPOTGATE_AGENT_VLLM__ENGINE_ARGS": "-q awq"}}, "agentSettings"),
        ({"models": []}, "models"),
        ({"models": {"name": "a", "model": "a"}}, "models"),
        ({"agentImage": "docker.io/vllm/vllm-openai:latest"}, "agentImage"),
        # ECR logins are per region: the agents log in to the stack's
        ({"agentImage": "123456789012.dkr.ecr.eu-west-1.amazonaws.com/a:1"}, "agentImage"),
        ({"opsScraperSecurityGroup": "0.0.0.0/0"}, "opsScraperSecurityGroup"),
    ],
)
def test_bad_values_name_their_key(context: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{key}: "):
        _plain(context)


def test_log_retention_must_be_a_cloudwatch_period() -> None:
    assert retention(30).name == "ONE_MONTH"
    with pytest.raises(ConfigError, match=r"^logRetentionDays: 31 is not one of"):
        retention(31)


def _one_model(**entry: Any) -> dict[str, Any]:
    """A context whose only model is `entry` (name and model filled in unless given)."""
    return {"models": [{"name": "m", "model": "org/m", **entry}]}


def test_a_model_entry_reads_every_key() -> None:
    entry = {
        "name": "qwen3-8b",
        "model": "s3://bucket/qwen3-8b",
        "revision": "",
        "fetch": "download",
        "instanceTypes": ["g6.xlarge"],
        "tensorParallelSize": 1,
        "engineArgs": "--kv-cache-dtype fp8",
        "toolCallParser": "hermes",
        "reasoningParser": "qwen3",
        "chatTemplate": "tool_chat.jinja",
        "minAgents": 0,
        "maxAgents": 3,
        "scaleToZeroIdleSeconds": 900,
        "warmPoolSize": 2,
        "rootVolumeGiB": 300,
        "agentSettings": {"SPOTGATE_AGENT_VLLM__MAX_MODEL_LEN": "16384"},
    }
    (model,) = _plain({"models": [entry]}).models
    assert model == ModelConfig(
        name="qwen3-8b",
        model="s3://bucket/qwen3-8b",
        fetch="download",
        instance_types=("g6.xlarge",),
        tensor_parallel_size=1,
        engine_args="--kv-cache-dtype fp8",
        tool_call_parser="hermes",
        reasoning_parser="qwen3",
        chat_template="tool_chat.jinja",
        min_agents=0,
        max_agents=3,
        scale_to_zero_idle_seconds=900,
        warm_pool_size=2,
        root_volume_gib=300,
        agent_settings=(("SPOTGATE_AGENT_VLLM__MAX_MODEL_LEN", "16384"),),
    )
    # `cdk deploy -c models='[…]'` hands the list in as text.
    assert _plain({"models": json.dumps([entry])}).models == (model,)


def test_an_entry_needs_only_a_name_and_a_model() -> None:
    (model,) = _plain({"models": [{"name": "m", "model": "org/m"}]}).models
    assert model == ModelConfig(name="m", model="org/m")
    assert (model.min_agents, model.max_agents, model.instance_types) == (1, 4, ())
    assert (model.warm_pool_size, model.root_volume_gib) == (0, None)
    # No warm pool: its cache on instance storage, its root volume the pool's.
    assert not model.keeps_cache_on_stop
    assert DeployConfig().root_volume_of(model) == 200


@pytest.mark.parametrize(
    ("models", "root_volume_gib", "volumes_gib"),
    [
        ([{}, {"rootVolumeGiB": 500}], 200, [200, 500]),
        ([{"warmPoolSize": 1}, {"rootVolumeGiB": 500}], 250, [250, 500]),
        # Two warm pools of two sizes: each priced at its own.
        ([{"warmPoolSize": 1, "rootVolumeGiB": 300}, {"warmPoolSize": 2}], 400, [300, 400]),
    ],
)
def test_a_stopped_instance_is_priced_at_its_own_models_volume(
    models: list[dict[str, Any]], root_volume_gib: int, volumes_gib: list[int]
) -> None:
    entries = [{"name": f"m{i}", "model": "org/m", **e} for i, e in enumerate(models)]
    config = _plain({"models": entries, "rootVolumeGiB": root_volume_gib})
    pool_models = json.loads(pool_models_json(config, {m.name: "lt" for m in config.models}))
    assert [model["volume_gib"] for model in pool_models] == volumes_gib
    assert [m.keeps_cache_on_stop for m in config.models] == ["warmPoolSize" in e for e in models]


def test_models_round_trip_through_the_context() -> None:
    config = DeployConfig(
        allow_plain_http=True,
        models=(
            DEFAULT_MODEL,
            ModelConfig(
                name="big",
                model="org/big",
                instance_types=("g5.xlarge",),
                tensor_parallel_size=1,
                scale_to_zero_idle_seconds=300,
                warm_pool_size=1,
                root_volume_gib=400,
                agent_settings=(("SPOTGATE_AGENT_VLLM__MAX_MODEL_LEN", "8192"),),
            ),
        ),
    )
    assert _config(dict(config_as_context(config))) == config


def test_the_default_model_is_pinned_and_serves_tools_and_reasoning() -> None:
    (model,) = DeployConfig().models
    assert re.fullmatch(r"[0-9a-f]{40}", model.revision)
    assert model.tool_call_parser
    assert model.reasoning_parser


@pytest.mark.parametrize("key", sorted(MOVED_KEYS))
def test_a_key_of_the_one_model_pool_says_where_it_moved(key: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{key}: moved into {re.escape(MOVED_KEYS[key])}; "):
        _plain({key: "1"})


@pytest.mark.parametrize(
    ("context", "key"),
    [
        ({"models": [{"model": "org/m"}]}, "models[0].name"),
        ({"models": [{"name": "m"}]}, "models[0].model"),
        ({"models": ["org/m"]}, "models[0]"),
        (_one_model(servedModelName="x"), "models[0]"),  # a key no entry has
        (_one_model(name=""), "models[0].name"),
        (_one_model(name="a\nb"), "models[0].name"),
        (_one_model(name="a|b"), "models[0].name"),  # not an EC2 tag value
        (_one_model(name="qwen3:8b"), "models[0].name"),  # `:` names a LoRA adapter
        (_one_model(name="x" * 120), "models[0].name"),  # its template name is too long
        (_one_model(model=""), "models[0].model"),
        (_one_model(revision="a\nb"), "models[0].revision"),
        (_one_model(fetch="copy"), "models[0].fetch"),
        (_one_model(instanceTypes=["p5.48xlarge"]), "models[0].instanceTypes"),
        (_one_model(instanceTypes="g5.xlarge"), "models[0].instanceTypes"),
        (_one_model(tensorParallelSize=0), "models[0].tensorParallelSize"),
        (_one_model(engineArgs="--kv-cache-dtype fp8\n--x"), "models[0].engineArgs"),
        (_one_model(engineArgs="--max-model-len 8192"), "models[0].engineArgs"),
        (_one_model(engineArgs="--quantization 'awq"), "models[0].engineArgs"),
        (_one_model(toolCallParser="a\nb"), "models[0].toolCallParser"),
        (_one_model(reasoningParser="a\nb"), "models[0].reasoningParser"),
        (_one_model(chatTemplate="{{ a }}\n{{ b }}"), "models[0].chatTemplate"),
        # Each of the pool's types has one GPU, and it may run on any of them.
        (_one_model(tensorParallelSize=2), "models[0].tensorParallelSize"),
        (_one_model(minAgents=-1), "models[0].minAgents"),
        (_one_model(minAgents=5, maxAgents=2), "models[0].maxAgents"),
        (_one_model(minAgents=0, maxAgents=0), "models[0].maxAgents"),
        (_one_model(scaleToZeroIdleSeconds=0), "models[0].scaleToZeroIdleSeconds"),
        (_one_model(warmPoolSize=-1), "models[0].warmPoolSize"),
        (_one_model(warmPoolSize=1.5), "models[0].warmPoolSize"),
        (_one_model(warmPoolSize="2"), "models[0].warmPoolSize"),
        # More stopped instances than could ever serve at once only cost.
        (_one_model(maxAgents=2, warmPoolSize=3), "models[0].warmPoolSize"),
        # Only on-demand cover starts a warm instance.
        ({**_one_model(warmPoolSize=1), "onDemandFallback": False}, "models[0].warmPoolSize"),
        (_one_model(rootVolumeGiB=0), "models[0].rootVolumeGiB"),
        (_one_model(rootVolumeGiB="big"), "models[0].rootVolumeGiB"),
        (_one_model(agentSettings={"SPOTGATE_POOL_X": "1"}), "models[0].agentSettings"),
        (_one_model(agentSettings={"spotgate_agent_model": "x"}), "models[0].agentSettings"),
        (
            {"models": [{"name": "m", "model": "a"}, {"name": "m", "model": "b"}]},
            "models[1].name",
        ),
        # Both make the launch template spotgate-agent-org-m.
        (
            {"models": [{"name": "org/m", "model": "a"}, {"name": "org m", "model": "b"}]},
            "models[1].name",
        ),
    ],
)
def test_bad_model_entries_name_their_key(context: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: "):
        _plain(context)


FOUR_GPUS = {"instanceType": "g6.12xlarge", "spotPricePerHour": 2.0, "onDemandPricePerHour": 4.6}
OWN_TYPE = {"instanceType": "x9.metal", "spotPricePerHour": 9.0, "onDemandPricePerHour": 20.0}


@pytest.mark.parametrize(
    ("instance_types", "model", "refusal"),
    [
        ([FOUR_GPUS], {"tensorParallelSize": 4}, None),
        ([FOUR_GPUS], {"tensorParallelSize": 8}, "models[0].tensorParallelSize: 8 GPUs, but "
         "g6.12xlarge has 4; give the model instanceTypes of 8 GPUs or more"),
        # Only the types it may run on count.
        ([FOUR_GPUS, {**FOUR_GPUS, "instanceType": "g6.xlarge"}],
         {"tensorParallelSize": 4, "instanceTypes": ["g6.12xlarge"]}, None),
        ([FOUR_GPUS, {**FOUR_GPUS, "instanceType": "g6.xlarge"}],
         {"tensorParallelSize": 4}, "models[0].tensorParallelSize: 4 GPUs, but g6.xlarge has 1"),
        # A type AWS's table here lacks: its count is given, or a sharded model cannot check.
        ([{**OWN_TYPE, "gpus": 16}], {"tensorParallelSize": 16}, None),
        ([OWN_TYPE], {"tensorParallelSize": 1}, None),
        ([OWN_TYPE], {"tensorParallelSize": 2}, "instanceTypes: give x9.metal's gpus"),
        ([{**OWN_TYPE, "gpus": 0}], {}, "instanceTypes: x9.metal's gpus: at least 1"),
    ],
)  # fmt: skip
def test_a_tensor_parallel_size_must_fit_the_gpus_of_every_type_it_runs_on(
    instance_types: list[dict[str, Any]], model: dict[str, Any], refusal: str | None
) -> None:
    context = {**_one_model(**model), "instanceTypes": instance_types}
    if refusal is None:
        config = _plain(context)
        assert _config(dict(config_as_context(config))) == config
        return
    with pytest.raises(ConfigError, match=rf"^{re.escape(refusal)}"):
        _plain(context)


def _region(region: str, cidr: str, *zones: str) -> dict[str, Any]:
    return {"region": region, "vpcCidr": cidr, "availabilityZones": list(zones)}


WEST = _region("us-west-2", "10.1.0.0/16", "us-west-2a", "us-west-2b")


@pytest.mark.parametrize(
    ("context", "line"),
    [
        ({"regions": [WEST]}, "regions: agents in other regions check the gateways' tokens"),
        (
            {"regions": [_region("us-west-9", "10.1.0.0/16", "us-west-9a", "us-west-9b")]},
            "regions[0].region: no EC2 region is called 'us-west-9'",
        ),
        (
            {"regions": [_region("us-east-1", "10.1.0.0/16", "us-east-1a", "us-east-1b")]},
            "regions[0].region: us-east-1 is the home region (region) already",
        ),
        (
            {"regions": [_region("us-west-2", "10.0.128.0/17", "us-west-2a", "us-west-2b")]},
            "regions[0].vpcCidr: 10.0.128.0/17 overlaps the home VPC's (vpcCidr) 10.0.0.0/16",
        ),
        (
            {"regions": [WEST, _region("eu-west-1", "10.1.0.0/18", "eu-west-1a", "eu-west-1b")]},
            "regions[1].vpcCidr: 10.1.0.0/18 overlaps regions[0].vpcCidr 10.1.0.0/16",
        ),
        ({"regions": [WEST, WEST]}, "regions[1].region: us-west-2 is regions[0]'s"),
        (
            {"regions": [_region("us-west-2", "10.1.0.0/16", "us-west-2a", "us-east-1b")]},
            "regions[0].availabilityZones: us-east-1b is not in us-west-2",
        ),
        (
            {"regions": [_region("us-west-2", "10.1.0.0/16", "us-west-2a")]},
            "regions[0].availabilityZones: name at least two zones of us-west-2",
        ),
        (
            {"regions": [_region("us-west-2", "10.1.0.0/24", "us-west-2a", "us-west-2b")]},
            "regions[0].vpcCidr: a /16 to /18 network (its zones' subnets), not /24",
        ),
        ({"regions": [{"region": "us-west-2"}]}, "regions[0]: expected an object with exactly"),
        ({"vpcCidr": "10.0.0.0/33"}, "vpcCidr: '10.0.0.0/33' is no IPv4 network"),
        ({"availabilityZones": ["eu-west-1a", "eu-west-1b"]}, "eu-west-1a is not in us-east-1"),
    ],
)
def test_bad_regions_are_one_line_naming_the_key(context: dict[str, Any], line: str) -> None:
    domain = {"gatewayDomain": "llm.example.com"} if context.get("regions") != [WEST] else {}
    with pytest.raises(ConfigError) as refused:
        _plain({**domain, **context})
    assert line in str(refused.value)
    assert "\n" not in str(refused.value)


def test_regions_round_trip_through_the_context() -> None:
    config = _plain({"gatewayDomain": "llm.example.com", "regions": [WEST]})
    assert [r.region for r in config.pool_regions] == ["us-west-2"]
    assert config.all_regions == ("us-east-1", "us-west-2")
    assert _plain({**config_as_context(config)}) == config
