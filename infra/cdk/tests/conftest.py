"""Fixtures for the CDK app's tests: the app synthesized once, read without an AWS account."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# jsii prints a banner on every start under a Node release it no longer lists; Node 20 works.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

CDK_DIR = Path(__file__).resolve().parents[1]
if str(CDK_DIR) not in sys.path:
    sys.path.insert(0, str(CDK_DIR))

from app import build_app  # noqa: E402
from aws_cdk.assertions import Template  # noqa: E402
from cfnlint.api import ManualArgs, lint_file  # noqa: E402
from stacks.spotgate_stack import SpotgateStack  # noqa: E402

Json = dict[str, Any]


def cdk_json_context() -> Json:
    """The context `cdk.json` gives the app."""
    context: Json = json.loads((CDK_DIR / "cdk.json").read_text())["context"]
    return context


@dataclass(frozen=True)
class Synthesized:
    """One synthesis: the stack object, its template, the cloud assembly and nag's verdict."""

    stack: SpotgateStack
    raw: Json
    template: Template
    outdir: Path
    validation_error: str | None

    def resources(self, resource_type: str) -> dict[str, Json]:
        """Logical id → resource, for every resource of `resource_type`."""
        return {
            logical_id: resource
            for logical_id, resource in self.raw["Resources"].items()
            if resource["Type"] == resource_type
        }

    def one(self, resource_type: str) -> tuple[str, Json]:
        """The only resource of `resource_type` (fails if there are none or several)."""
        found = self.resources(resource_type)
        assert len(found) == 1, f"expected one {resource_type}, found {sorted(found)}"
        return next(iter(found.items()))

    def container(self, name: str) -> Json:
        """The container definition called `name`."""
        for task in self.resources("AWS::ECS::TaskDefinition").values():
            for container in task["Properties"]["ContainerDefinitions"]:
                if container["Name"] == name:
                    return dict(container)
        raise AssertionError(f"no container {name}")

    def container_env(self, name: str) -> dict[str, Any]:
        """The container's environment: variable → value (text, or an intrinsic)."""
        return {item["Name"]: item["Value"] for item in self.container(name)["Environment"]}


def synthesize(outdir: Path, overrides: Mapping[str, Any] | None = None) -> Synthesized:
    """Synthesize the app with cdk.json's context (plus `overrides`) into `outdir`."""
    app, stack = build_app({**cdk_json_context(), **(overrides or {})}, outdir=str(outdir))
    validation_error = None
    try:
        app.synth()
    except RuntimeError as err:  # jsii's form of the validation failure; the files are written
        validation_error = str(err)
    raw = json.loads((outdir / stack.template_file).read_text())
    return Synthesized(stack, raw, Template.from_json(raw), outdir, validation_error)


def cfn_lint_errors(template: Path, region: str) -> list[str]:
    """cfn-lint's errors (not its warnings) on a synthesized template, one line each."""
    matches = lint_file(template, ManualArgs(regions=[region]))
    return [f"{m.rule.id} {m.message} ({m.path})" for m in matches if m.rule.id.startswith("E")]


PLAIN_HTTP = {"allowPlainHttp": True}
"""cdk.json's defaults, less the certificate they require (`test_variant` has one)."""


@pytest.fixture(scope="session")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """The app as `cdk deploy` synthesizes it with cdk.json's defaults on plain HTTP (once)."""
    return synthesize(tmp_path_factory.mktemp("cdk.out"), PLAIN_HTTP)


def render(value: Any) -> str:
    """A CloudFormation value as text, intrinsics replaced by readable stand-ins.

    `{"Ref": "X"}` → `<Ref:X>`, `{"Fn::GetAtt": ["X", "A"]}` → `<X.A>`, the n-th zone of the
    region → `<AZ:n>`; joins are joined, so JSON built from tokens can be parsed.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if isinstance(value, dict) and len(value) == 1:
        ((function, argument),) = value.items()
        if function == "Ref":
            return f"<Ref:{argument}>"
        if function == "Fn::GetAtt":
            return f"<{argument[0]}.{argument[1]}>"
        if function == "Fn::Join":
            delimiter, parts = argument
            return str(delimiter).join(render(part) for part in parts)
        if function == "Fn::Select" and argument[1] == {"Fn::GetAZs": ""}:
            return f"<AZ:{argument[0]}>"
        if function == "Fn::Sub" and isinstance(argument, str):
            return argument
        if function == "Fn::Base64":
            return render(argument)
    raise AssertionError(f"cannot render {value!r}")


def statements(raw: Json) -> Iterator[tuple[str, Json]]:
    """Every IAM statement in the template: identity policies, inline role policies, resource
    policies (queues, buckets), with the logical id that holds it."""
    for logical_id, resource in raw["Resources"].items():
        properties = resource.get("Properties", {})
        documents = []
        if "PolicyDocument" in properties:
            documents.append(properties["PolicyDocument"])
        for policy in (
            properties.get("Policies", []) if resource["Type"] == "AWS::IAM::Role" else []
        ):
            documents.append(policy["PolicyDocument"])
        if resource["Type"] == "AWS::IAM::Role":
            documents.append(properties["AssumeRolePolicyDocument"])
        for document in documents:
            for statement in document["Statement"]:
                yield logical_id, statement


def as_list(value: Any) -> list[Any]:
    """A policy field that may be one value or a list, as a list."""
    return value if isinstance(value, list) else [value]
