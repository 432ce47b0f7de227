"""A pool of two models: each its own launch template telling its agents their model, its own
root volume, bounds, warm pool, instance types and template in the pool manager's settings,
its own alarms; the pool manager may launch from those two templates and no other."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from conftest import PLAIN_HTTP, Json, Synthesized, as_list, cdk_json_context, render, synthesize
from test_user_data import boot_in_sandbox

from spotgate.settings import AgentSettings, PoolModel, PoolSettings

FOUR_GPUS = {"instanceType": "g6.12xlarge", "spotPricePerHour": 2.0, "onDemandPricePerHour": 4.6}
SMALL = {
    "name": "small",
    "model": "Qwen/Qwen3-4B",
    "revision": "a" * 40,
    "instanceTypes": ["g6.xlarge"],
    "toolCallParser": "hermes",
    "reasoningParser": "qwen3",
    "minAgents": 1,
    "maxAgents": 2,
    "warmPoolSize": 1,
    "rootVolumeGiB": 300,
}
BIG = {
    "name": "org/big",
    "model": "s3://models-bucket/big/v1",
    "fetch": "download",
    "instanceTypes": [FOUR_GPUS["instanceType"]],
    "tensorParallelSize": 2,
    "engineArgs": "--kv-cache-dtype fp8",
    "minAgents": 0,
    "maxAgents": 3,
    "scaleToZeroIdleSeconds": 900,
    "rootVolumeGiB": 400,
    "agentSettings": {"SPOTGATE_AGENT_VLLM__MAX_MODEL_LEN": "32768"},
}
TEMPLATE_NAMES = {"small": "spotgate-agent-small", "org/big": "spotgate-agent-org-big"}


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """The app with the two models above, the 4-GPU type added to cdk.json's catalog."""
    catalog = [*cdk_json_context()["instanceTypes"], FOUR_GPUS]
    return synthesize(
        tmp_path_factory.mktemp("cdk.out"),
        {**PLAIN_HTTP, "instanceTypes": catalog, "models": [SMALL, BIG]},
    )


def _templates(synthesized: Synthesized) -> dict[str, tuple[str, Json]]:
    """Launch template name → (logical id, its LaunchTemplateData)."""
    return {
        template["Properties"]["LaunchTemplateName"]: (
            logical_id,
            template["Properties"]["LaunchTemplateData"],
        )
        for logical_id, template in synthesized.resources("AWS::EC2::LaunchTemplate").items()
    }


def _agent_env(data: Json) -> dict[str, str]:
    """The settings file a template's boot script writes."""
    script = render(data["UserData"])
    match = re.search(r"<<'SETTINGS'\n(.*?)\nSETTINGS\n", script, re.DOTALL)
    assert match is not None, "no settings block in the boot script"
    return dict(line.split("=", 1) for line in match.group(1).splitlines())


def _agent_settings(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> AgentSettings:
    for name in list(os.environ):
        if name.startswith("SPOTGATE_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return AgentSettings()


def test_two_models_pass_the_checks(two_models: Synthesized) -> None:
    assert two_models.validation_error is None, two_models.validation_error


def test_each_model_has_a_template_that_differs_only_in_its_boot_script_and_root_volume(
    two_models: Synthesized,
) -> None:
    templates = _templates(two_models)
    assert set(templates) == set(TEMPLATE_NAMES.values())
    small, big = (templates[TEMPLATE_NAMES[name]][1] for name in ("small", "org/big"))
    assert small["UserData"] != big["UserData"]
    # Each its own size (the warm pool's volume keeps the weights), the same kind of volume.
    (small_root,) = small["BlockDeviceMappings"]
    (big_root,) = big["BlockDeviceMappings"]
    assert (small_root["Ebs"]["VolumeSize"], big_root["Ebs"]["VolumeSize"]) == (300, 400)
    assert {**small_root["Ebs"], "VolumeSize": 400} == big_root["Ebs"]
    assert small_root["DeviceName"] == big_root["DeviceName"]

    def rest(data: Json) -> Json:
        return {
            key: value
            for key, value in data.items()
            if key not in ("UserData", "BlockDeviceMappings")
        }

    assert rest(small) == rest(big)
    assert small["MetadataOptions"]["HttpTokens"] == "required"
    # One instance profile, the agents' role, for every template.
    profile_id, _profile = two_models.one("AWS::IAM::InstanceProfile")
    assert small["IamInstanceProfile"] == {"Arn": {"Fn::GetAtt": [profile_id, "Arn"]}}


def test_each_boot_script_tells_its_agents_their_model_and_only_theirs(
    two_models: Synthesized, monkeypatch: pytest.MonkeyPatch
) -> None:
    templates = _templates(two_models)
    small_env = _agent_env(templates[TEMPLATE_NAMES["small"]][1])
    big_env = _agent_env(templates[TEMPLATE_NAMES["org/big"]][1])

    small = _agent_settings(small_env, monkeypatch)
    assert (small.model, small.served_model_name) == ("Qwen/Qwen3-4B", "small")
    assert small.vllm.revision == "a" * 40
    assert small.vllm.tensor_parallel_size == 1
    assert (small.vllm.tool_call_parser, small.vllm.reasoning_parser) == ("hermes", "qwen3")
    assert small.vllm.engine_args == ""
    assert small.vllm.max_model_len is None

    big = _agent_settings(big_env, monkeypatch)
    assert (big.model, big.served_model_name) == ("s3://models-bucket/big/v1", "org/big")
    assert big.model_fetch == "download"
    assert big.vllm.revision is None
    assert big.vllm.tensor_parallel_size == 2
    assert big.vllm.engine_args == "--kv-cache-dtype fp8"
    assert (big.vllm.tool_call_parser, big.vllm.reasoning_parser) == (None, None)
    assert big.vllm.max_model_len == 32768  # its own agentSettings

    # Nothing of one model's in the other's script.
    small_script = render(templates[TEMPLATE_NAMES["small"]][1]["UserData"])
    big_script = render(templates[TEMPLATE_NAMES["org/big"]][1]["UserData"])
    for text in ("s3://models-bucket/big/v1", "org/big", "fp8", "32768"):
        assert text not in small_script, text
    for text in ("Qwen/Qwen3-4B", "=small", "a" * 40, "hermes"):
        assert text not in big_script, text


def test_the_pool_manager_gets_each_models_bounds_types_and_template(
    two_models: Synthesized, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {name: render(value) for name, value in two_models.container_env("pool-manager").items()}
    # Per-model values are always given: pool-wide ones would never be read.
    for unused in (
        "SPOTGATE_POOL_MIN_AGENTS",
        "SPOTGATE_POOL_MAX_AGENTS",
        "SPOTGATE_POOL_EC2__LAUNCH_TEMPLATE",
    ):
        assert unused not in env
    for name in list(os.environ):
        if name.startswith("SPOTGATE_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    pool = PoolSettings()
    templates = _templates(two_models)
    assert pool.models == (
        PoolModel(
            name="small",
            min_agents=1,
            max_agents=2,
            warm_pool_size=1,
            volume_gib=300,
            instance_types=("g6.xlarge",),
            launch_template=f"<Ref:{templates[TEMPLATE_NAMES['small']][0]}>",
        ),
        PoolModel(
            name="org/big",
            min_agents=0,
            max_agents=3,
            scale_to_zero_idle_seconds=900,
            warm_pool_size=0,
            volume_gib=400,
            instance_types=("g6.12xlarge",),
            launch_template=f"<Ref:{templates[TEMPLATE_NAMES['org/big']][0]}>",
        ),
    )
    assert "g6.12xlarge" in {placement.instance_type for placement in pool.placements}
    # A stopped instance is priced at its own model's volume (above); the pool's stands in
    # for none.
    assert pool.volume_gib == 200


def _cache_mount(script: str, sandbox: Path) -> str:
    """What the agent's cache is mounted from on an instance with NVMe storage."""
    booted = boot_in_sandbox(script, sandbox, nvme=True)
    unit = (booted / "root/etc/systemd/system/spotgate-agent.service").read_text()
    (start,) = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    run = shlex.split(start.removeprefix("ExecStart="))
    host, _container = run[run.index("--volume") + 1].split(":")
    assert f"ExecStartPre=/usr/bin/install -d -o 10001 {host}" in unit.splitlines()
    return host


def test_a_model_with_a_warm_pool_keeps_its_cache_where_a_stop_keeps_it(
    two_models: Synthesized, tmp_path: Path
) -> None:
    templates = _templates(two_models)
    small, big = (render(templates[TEMPLATE_NAMES[n]][1]["UserData"]) for n in ("small", "org/big"))
    (tmp_path / "small").mkdir()
    (tmp_path / "big").mkdir()
    # The root volume, stopped with the instance: a warm start finds the weights there.
    assert _cache_mount(small, tmp_path / "small") == "/var/cache/spotgate"
    # Instance storage, fastest for a cold boot, wiped by a stop.
    assert _cache_mount(big, tmp_path / "big") == "/opt/dlami/nvme/spotgate"


def test_the_gateway_serves_both_names(two_models: Synthesized) -> None:
    models = two_models.container_env("gateway")["SPOTGATE_GATEWAY_MODELS"]
    assert json.loads(models) == ["small", "org/big"]


def _launch_statements(synthesized: Synthesized) -> dict[str, Json]:
    for task in synthesized.resources("AWS::ECS::TaskDefinition").values():
        names = [item["Name"] for item in task["Properties"]["ContainerDefinitions"]]
        if "pool-manager" in names:
            role = task["Properties"]["TaskRoleArn"]["Fn::GetAtt"][0]
    found: dict[str, Json] = {}
    for policy in synthesized.resources("AWS::IAM::Policy").values():
        if {"Ref": role} in policy["Properties"]["Roles"]:
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
                found[statement["Sid"]] = statement
    return found


def test_the_pool_manager_may_launch_from_the_two_templates_and_no_other(
    two_models: Synthesized,
) -> None:
    templates = _templates(two_models)
    expected = {
        f"arn:<Ref:AWS::Partition>:ec2:us-east-1:<Ref:AWS::AccountId>:launch-template/<Ref:{i}>"
        for i, _data in templates.values()
    }
    assert len(expected) == 2
    by_sid = _launch_statements(two_models)
    launch = by_sid["LaunchPoolInstances"]
    condition: list[Any] = as_list(launch["Condition"]["ArnLike"]["ec2:LaunchTemplate"])
    assert {render(arn) for arn in condition} == expected
    assert len(condition) == 2
    resources = {render(arn) for arn in as_list(by_sid["LaunchFromAgentTemplate"]["Resource"])}
    assert {arn for arn in resources if ":launch-template/" in arn} == expected
    assert "g6.12xlarge" in launch["Condition"]["StringEquals"]["ec2:InstanceType"]


def test_each_model_has_its_own_alarms_and_graph(two_models: Synthesized) -> None:
    no_ready = {
        next(
            dimension["Value"]
            for query in alarm["Properties"]["Metrics"]
            if "MetricStat" in query
            for dimension in query["MetricStat"]["Metric"]["Dimensions"]
        ): alarm["Properties"]
        for logical_id, alarm in two_models.resources("AWS::CloudWatch::Alarm").items()
        if "NoReadyAgents" in logical_id
    }
    assert set(no_ready) == {"small", "org/big"}
    # An empty pool alarms at once only for the model that keeps agents ready.
    expression = {
        name: next(q["Expression"] for q in props["Metrics"] if "Expression" in q)
        for name, props in no_ready.items()
    }
    assert "1 > 0" in expression["small"]
    assert "0 > 0" in expression["org/big"]
    queued = {
        alarm["Properties"]["Dimensions"][0]["Value"]
        for logical_id, alarm in two_models.resources("AWS::CloudWatch::Alarm").items()
        if "HighQueueTime" in logical_id
    }
    assert queued == {"small", "org/big"}
    _id, dashboard = two_models.one("AWS::CloudWatch::Dashboard")
    body = render(dashboard["Properties"]["DashboardBody"])
    assert "(small)" in body
    assert "(org/big)" in body
    (function,) = [
        f
        for i, f in two_models.resources("AWS::Lambda::Function").items()
        if "RegistryMetrics" in i
    ]
    assert json.loads(function["Properties"]["Environment"]["Variables"]["MODELS"]) == [
        "small",
        "org/big",
    ]
