"""A pool over three regions: the home stack, a stack per other region and its routes back."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from app import build_app
from conftest import PLAIN_HTTP, Json, cdk_json_context, cfn_lint_errors, render, statements

from spotgate.settings import PoolSettings

DOMAIN = "llm.example.com"
HOME, WEST, EUROPE = "us-east-1", "us-west-2", "eu-west-1"
REGIONS = [
    {"region": WEST, "vpcCidr": "10.1.0.0/16", "availabilityZones": ["us-west-2a", "us-west-2b"]},
    {"region": EUROPE, "vpcCidr": "10.2.0.0/18", "availabilityZones": ["eu-west-1a", "eu-west-1b"]},
]
STAGED = "s3://home-models/qwen/v1"
ADAPTERS = {"sql": "s3://home-models/sql-adapter", "hub": "org/adapter"}


@dataclass(frozen=True)
class App:
    """Every stack's template, by stack name, and where each is deployed."""

    templates: dict[str, Json]
    regions: dict[str, str]
    outdir: Path
    validation_error: str | None

    def resources(self, stack: str, resource_type: str) -> list[Json]:
        """The stack's resources of `resource_type`."""
        found = self.templates[stack]["Resources"].values()
        return [resource for resource in found if resource["Type"] == resource_type]


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> App:
    """The app with two more regions, synthesized once."""
    outdir = tmp_path_factory.mktemp("cdk.out")
    context = {
        **cdk_json_context(),
        **PLAIN_HTTP,
        "gatewayDomain": DOMAIN,
        "availabilityZones": ["us-east-1a", "us-east-1b"],
        "regions": REGIONS,
        "models": [
            {
                "name": "qwen",
                "model": STAGED,
                "minAgents": 1,
                "agentSettings": {"SPOTGATE_AGENT_VLLM__LORA_ADAPTERS": json.dumps(ADAPTERS)},
            }
        ],
    }
    built, _home = build_app(context, outdir=str(outdir))
    validation_error = None
    try:
        built.synth()
    except RuntimeError as err:
        validation_error = str(err)
    stacks = [child for child in built.node.children if hasattr(child, "template_file")]
    return App(
        templates={
            s.stack_name: json.loads((outdir / s.template_file).read_text()) for s in stacks
        },
        regions={s.stack_name: s.region for s in stacks},
        outdir=outdir,
        validation_error=validation_error,
    )


def test_each_region_has_its_stack_and_every_template_passes_the_checks(app: App) -> None:
    assert app.regions == {
        "Spotgate": HOME,
        f"Spotgate-{WEST}": WEST,
        f"Spotgate-{EUROPE}": EUROPE,
        f"Spotgate-{WEST}-routes": WEST,
        f"Spotgate-{EUROPE}-routes": EUROPE,
    }
    assert app.validation_error is None, app.validation_error  # cdk-nag, every stack
    for name, region in app.regions.items():
        assert cfn_lint_errors(app.outdir / f"{name}.template.json", region) == [], name


def test_the_home_vpc_is_peered_with_each_region_and_routes_go_both_ways(app: App) -> None:
    peerings = app.resources("Spotgate", "AWS::EC2::VPCPeeringConnection")
    assert sorted(p["Properties"]["PeerRegion"] for p in peerings) == sorted([WEST, EUROPE])
    home_routes = [
        r["Properties"]["DestinationCidrBlock"]
        for r in app.resources("Spotgate", "AWS::EC2::Route")
        if "VpcPeeringConnectionId" in r["Properties"]
    ]
    # From each of the two private subnets to each region's network.
    assert sorted(home_routes) == sorted(["10.1.0.0/16", "10.2.0.0/18"] * 2)
    for region in (WEST, EUROPE):
        back = app.resources(f"Spotgate-{region}-routes", "AWS::EC2::Route")
        assert [r["Properties"]["DestinationCidrBlock"] for r in back] == ["10.0.0.0/16"] * 2
    for region, entry in ((WEST, REGIONS[0]), (EUROPE, REGIONS[1])):
        (vpc,) = app.resources(f"Spotgate-{region}", "AWS::EC2::VPC")
        assert vpc["Properties"]["CidrBlock"] == entry["vpcCidr"]


def _user_data(app: App, stack: str) -> str:
    (template,) = app.resources(stack, "AWS::EC2::LaunchTemplate")
    return render(template["Properties"]["LaunchTemplateData"]["UserData"])


def test_agents_elsewhere_register_at_home_and_read_their_own_regions_copy(app: App) -> None:
    home = _user_data(app, "Spotgate")
    assert f"SPOTGATE_AGENT_MODEL={STAGED}\n" in home  # the home region's, as configured
    assert "SPOTGATE_AGENT_MODEL_REGION" not in home
    assert f"SPOTGATE_AGENT_VLLM__LORA_ADAPTERS={json.dumps(ADAPTERS)}\n" in home
    for region in (WEST, EUROPE):
        script = _user_data(app, f"Spotgate-{region}")
        (bucket,) = [
            logical_id
            for logical_id, resource in app.templates[f"Spotgate-{region}"]["Resources"].items()
            if resource["Type"] == "AWS::S3::Bucket"
        ]
        assert f"SPOTGATE_AGENT_MODEL=s3://<Ref:{bucket}>/qwen/v1\n" in script
        own = {"sql": f"s3://<Ref:{bucket}>/sql-adapter", "hub": "org/adapter"}
        assert f"SPOTGATE_AGENT_VLLM__LORA_ADAPTERS={json.dumps(own)}\n" in script
        assert f"SPOTGATE_AWS__REGION={HOME}\n" in script  # the registry's region
        assert f"SPOTGATE_AGENT_MODEL_REGION={region}\n" in script  # its bucket's
        assert "SPOTGATE_TABLES__AGENTS=spotgate-agents\n" in script
        assert f"SPOTGATE_AGENT_TOKEN_ISSUER=http://{DOMAIN}\n" in script
        # One name for a model's template in every region: the pool manager launches by it.
        (template,) = app.resources(f"Spotgate-{region}", "AWS::EC2::LaunchTemplate")
        assert template["Properties"]["LaunchTemplateName"] == "spotgate-agent-qwen"


def test_agents_elsewhere_admit_the_home_network_and_forward_ec2_events_home(app: App) -> None:
    for region in (WEST, EUROPE):
        stack = f"Spotgate-{region}"
        (group,) = app.resources(stack, "AWS::EC2::SecurityGroup")
        assert [
            (rule["CidrIp"], rule["FromPort"], rule["ToPort"])
            for rule in group["Properties"]["SecurityGroupIngress"]
        ] == [("10.0.0.0/16", 8000, 8000)]
        (rule,) = app.resources(stack, "AWS::Events::Rule")
        assert rule["Properties"]["EventPattern"]["source"] == ["aws.ec2"]
        (target,) = rule["Properties"]["Targets"]
        assert render(target["Arn"]).endswith(
            f":events:{HOME}:<Ref:AWS::AccountId>:event-bus/default"
        )


def _container_env(app: App, name: str) -> dict[str, str]:
    for task in app.resources("Spotgate", "AWS::ECS::TaskDefinition"):
        for container in task["Properties"]["ContainerDefinitions"]:
            if container["Name"] == name:
                return {e["Name"]: render(e["Value"]) for e in container["Environment"]}
    raise AssertionError(f"no {name} container")


def test_the_pool_manager_places_in_every_regions_zones_by_template_name(app: App) -> None:
    env = _container_env(app, "pool-manager")
    settings = _read_pool_settings(env)
    assert settings.pool_regions == (HOME, WEST, EUROPE)
    zones = ["us-east-1a", "us-east-1b", "us-west-2a", "us-west-2b", "eu-west-1a", "eu-west-1b"]
    assert sorted(settings.ec2.subnets) == sorted(zones)
    assert sorted({p.zone for p in settings.placements}) == sorted(zones)
    assert [m.launch_template for m in settings.models] == ["spotgate-agent-qwen"]
    gateway_networks = json.loads(_container_env(app, "gateway")["SPOTGATE_GATEWAY_AGENT_NETWORKS"])
    assert gateway_networks[1:] == ["10.1.0.0/16", "10.2.0.0/18"]


def _read_pool_settings(env: dict[str, str]) -> PoolSettings:
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        return PoolSettings()


def test_the_pool_manager_may_launch_and_end_its_pool_in_its_regions_only(app: App) -> None:
    found: dict[str, Any] = {
        statement["Sid"]: statement
        for _id, statement in statements(app.templates["Spotgate"])
        if "Sid" in statement
    }
    for region, suffix in ((HOME, ""), (WEST, "UsWest2"), (EUROPE, "EuWest1")):
        launch = found[f"LaunchPoolInstances{suffix}"]
        assert (
            render(launch["Resource"])
            == f"arn:<Ref:AWS::Partition>:ec2:{region}:<Ref:AWS::AccountId>:instance/*"
        )
    terminate = [render(r) for r in found["TerminatePoolInstances"]["Resource"]]
    assert [re.search(r":ec2:([a-z0-9-]+):", arn)[1] for arn in terminate] == [HOME, WEST, EUROPE]  # type: ignore[index]
    assert len(found["PassAgentRole"]["Resource"]) == 3  # each region's agents' role
