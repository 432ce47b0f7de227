"""The app with non-default settings, given as `cdk deploy -c key=value` gives them (text):
HTTPS on a domain, prebuilt images, a staged model, scale to zero, three named zones."""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Annotations, Match
from conftest import Synthesized, render, synthesize

DOMAIN = "llm.example.com"
CERTIFICATE = "arn:aws:acm:eu-west-1:123456789012:certificate/00000000-0000-0000-0000-000000000000"
IMAGE = "public.ecr.aws/example/spotgate:1.2.3"
AGENT_IMAGE = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/ci/spotgate-agent@sha256:" + "ab" * 32
ZONES = ["eu-west-1a", "eu-west-1b", "eu-west-1c"]


@pytest.fixture(scope="module")
def variant(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """The app synthesized once with the settings above, every value as text."""
    return synthesize(
        tmp_path_factory.mktemp("cdk.out"),
        {
            "region": "eu-west-1",
            "gatewayDomain": DOMAIN,
            "certificateArn": CERTIFICATE,
            "containerImage": IMAGE,
            "agentImage": AGENT_IMAGE,
            "models": json.dumps(
                [
                    {
                        "name": "qwen",
                        "model": "s3://models-bucket/qwen/v1",
                        "fetch": "download",
                        "minAgents": 0,
                        "scaleToZeroIdleSeconds": 300,
                    }
                ]
            ),
            "availabilityZones": json.dumps(ZONES),
            "onDemandFallback": "false",
            "agentSettings": json.dumps({"SPOTGATE_AGENT_VLLM__MAX_MODEL_LEN": "8192"}),
        },
    )


def test_https_listener_with_the_certificate_and_a_redirect(variant: Synthesized) -> None:
    assert variant.validation_error is None, variant.validation_error
    listeners = {
        listener["Properties"]["Port"]: listener["Properties"]
        for listener in variant.resources("AWS::ElasticLoadBalancingV2::Listener").values()
    }
    assert set(listeners) == {80, 443}
    assert listeners[443]["Protocol"] == "HTTPS"
    assert listeners[443]["Certificates"] == [{"CertificateArn": CERTIFICATE}]
    redirect = listeners[80]["DefaultActions"][0]
    assert redirect["Type"] == "redirect"
    assert redirect["RedirectConfig"]["Protocol"] == "HTTPS"
    assert redirect["RedirectConfig"]["Port"] == "443"


def test_gateway_and_agents_use_the_https_domain(variant: Synthesized) -> None:
    env = variant.container_env("gateway")
    assert env["SPOTGATE_GATEWAY_PUBLIC_URL"] == f"https://{DOMAIN}"
    _id, template = variant.one("AWS::EC2::LaunchTemplate")
    script = render(template["Properties"]["LaunchTemplateData"]["UserData"])
    assert f"SPOTGATE_AGENT_TOKEN_ISSUER=https://{DOMAIN}\n" in script
    assert "SPOTGATE_AGENT_VLLM__MAX_MODEL_LEN=8192\n" in script
    assert render(variant.raw["Outputs"]["ChatUrl"]["Value"]) == f"https://{DOMAIN}/"


def test_prebuilt_image_needs_no_docker_build(variant: Synthesized) -> None:
    assert variant.container("gateway")["Image"] == IMAGE
    assert variant.container("pool-manager")["Image"] == IMAGE
    assets = json.loads((variant.outdir / f"{variant.stack.stack_name}.assets.json").read_text())
    assert assets.get("dockerImages", {}) == {}
    _id, template = variant.one("AWS::EC2::LaunchTemplate")
    script = render(template["Properties"]["LaunchTemplateData"]["UserData"])
    assert f"IMAGE='{AGENT_IMAGE}'\n" in script
    pulls = [
        statement
        for policy in variant.resources("AWS::IAM::Policy").values()
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
        if "ecr:BatchGetImage" in statement["Action"]
    ]
    assert [render(p["Resource"]) for p in pulls] == [
        "arn:<Ref:AWS::Partition>:ecr:eu-west-1:123456789012:repository/ci/spotgate-agent"
    ]


def test_a_staged_model_is_fetched_as_asked_and_needs_no_revision(variant: Synthesized) -> None:
    _id, template = variant.one("AWS::EC2::LaunchTemplate")
    script = render(template["Properties"]["LaunchTemplateData"]["UserData"])
    assert "SPOTGATE_AGENT_MODEL=s3://models-bucket/qwen/v1\n" in script
    assert "SPOTGATE_AGENT_MODEL_FETCH=download\n" in script
    assert not Annotations.from_stack(variant.stack).find_warning(
        "*", Match.string_like_regexp("has no revision")
    )


def test_text_context_values_are_parsed(variant: Synthesized) -> None:
    env = variant.container_env("pool-manager")
    (model,) = json.loads(render(env["SPOTGATE_POOL_MODELS"]))
    assert (model["name"], model["min_agents"], model["scale_to_zero_idle_seconds"]) == (
        "qwen",
        0,
        300,
    )
    assert env["SPOTGATE_POOL_ON_DEMAND_FALLBACK"] == "false"
    subnets = json.loads(render(env["SPOTGATE_POOL_EC2__SUBNETS"]))
    assert sorted(subnets) == ZONES
    placements = json.loads(render(env["SPOTGATE_POOL_PLACEMENTS"]))
    assert {placement["zone"] for placement in placements} == set(ZONES)
    # With scale to zero, an empty pool only alarms while streams wait.
    (no_ready,) = [
        alarm["Properties"]
        for logical_id, alarm in variant.resources("AWS::CloudWatch::Alarm").items()
        if "NoReadyAgents" in logical_id
    ]
    (expression,) = [query["Expression"] for query in no_ready["Metrics"] if "Expression" in query]
    assert "0 > 0" in expression
