"""The synthesized stack holds every resource the deployment needs, configured as spotgate
expects: the settings' names, ARCHITECTURE.md's tables, EC2's event names, least privilege."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Annotations, Match
from conftest import (
    CDK_DIR,
    PLAIN_HTTP,
    Synthesized,
    as_list,
    cdk_json_context,
    render,
    statements,
    synthesize,
)
from stacks.config import DeployConfig
from stacks.context import CONTEXT_KEYS, MODEL_KEYS, config_as_context

from gateway.server import GOING_AWAY_WRITE_SECONDS
from pool_manager.ec2_provider import BOOT_TAG, POOL_TAG, STARTED_AT_TAG, STOPPED_AT_TAG
from pool_manager.events import (
    EC2_EVENT_PATTERN,
    INTERRUPTION_DETAIL_TYPE,
    REBALANCE_DETAIL_TYPE,
    STATE_CHANGE_DETAIL_TYPE,
)
from spotgate.registry import BY_CHANGE_INDEX, BY_MODEL_INDEX, BY_WORK_INDEX, FEED_FIELDS
from spotgate.settings import GatewaySettings, PoolModel, PoolSettings
from spotgate.tokens import SigningKey

DEFAULTS = DeployConfig()
(DEFAULT_MODEL,) = DEFAULTS.models


def _ref(logical_id: str) -> str:
    return f"<Ref:{logical_id}>"


def _logical_id(synthesized: Synthesized, resource_type: str, path_part: str) -> str:
    matches = [
        logical_id
        for logical_id, resource in synthesized.resources(resource_type).items()
        if path_part in resource.get("Metadata", {}).get("aws:cdk:path", logical_id)
        or path_part in logical_id
    ]
    assert len(matches) == 1, f"{resource_type} {path_part}: {matches}"
    return matches[0]


def _table_id(synthesized: Synthesized, name: str) -> str:
    return _logical_id(synthesized, "AWS::DynamoDB::Table", f"Registry{name}")


def _private_subnet_ids(synthesized: Synthesized) -> set[str]:
    return {
        logical_id
        for logical_id, subnet in synthesized.resources("AWS::EC2::Subnet").items()
        if {"Key": "aws-cdk:subnet-type", "Value": "Private"} in subnet["Properties"]["Tags"]
    }


def _policy_statements_of_role(synthesized: Synthesized, role_id: str) -> list[dict[str, Any]]:
    found = []
    for policy in synthesized.resources("AWS::IAM::Policy").values():
        if {"Ref": role_id} in policy["Properties"]["Roles"]:
            found.extend(policy["Properties"]["PolicyDocument"]["Statement"])
    return found


def _files_bucket_id(synthesized: Synthesized) -> str:
    return _logical_id(synthesized, "AWS::S3::Bucket", "GatewayFiles")


def _task_role(synthesized: Synthesized, container: str) -> str:
    for task in synthesized.resources("AWS::ECS::TaskDefinition").values():
        names = [item["Name"] for item in task["Properties"]["ContainerDefinitions"]]
        if container in names:
            return str(task["Properties"]["TaskRoleArn"]["Fn::GetAtt"][0])
    raise AssertionError(f"no task runs {container}")


# --- settings ------------------------------------------------------------------------------


def test_cdk_json_holds_every_setting_with_its_default_and_a_description() -> None:
    context = cdk_json_context()
    docs = context.pop("//")
    assert json.loads((CDK_DIR / "cdk.json").read_text())["app"] == "python3 app.py"
    assert set(context) == set(CONTEXT_KEYS)
    assert context == config_as_context(DEFAULTS)
    assert set(docs) == {*CONTEXT_KEYS, *(f"models[].{key}" for key in MODEL_KEYS)}
    assert all(isinstance(text, str) and text for text in docs.values())


def test_services_accept_every_setting_the_stack_gives_them(
    synthesized: Synthesized, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway_env = {
        name: render(value) for name, value in synthesized.container_env("gateway").items()
    }
    pool_env = {
        name: render(value) for name, value in synthesized.container_env("pool-manager").items()
    }
    for name in [*gateway_env, *pool_env]:
        monkeypatch.delenv(name, raising=False)
    # The VPC's range is known at deploy only; its rendering is checked on its own below.
    gateway_env["SPOTGATE_GATEWAY_AGENT_NETWORKS"] = '["10.0.0.0/16"]'
    for name, value in gateway_env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SPOTGATE_GATEWAY_TOKEN__SIGNING_KEY_PEM", SigningKey.generate().to_pem())
    gateway = GatewaySettings()
    assert gateway.host == "0.0.0.0"  # noqa: S104 — what the task must bind
    balancer_id, _balancer = synthesized.one("AWS::ElasticLoadBalancingV2::LoadBalancer")
    assert gateway.public_url == f"http://<{balancer_id}.DNSName>"
    assert gateway.models == (DEFAULT_MODEL.name,)
    assert gateway.shutdown_grace_seconds == DEFAULTS.gateway_drain_seconds
    assert gateway.shared.tables.agents == _ref(_table_id(synthesized, "Agents"))
    assert gateway.shared.tables.keys == _ref(_table_id(synthesized, "Keys"))
    assert gateway.shared.tables.demand == _ref(_table_id(synthesized, "Demand"))
    assert gateway.shared.tables.batches == _ref(_table_id(synthesized, "Batches"))
    assert gateway.shared.files_bucket == _ref(_files_bucket_id(synthesized))
    assert gateway.shared.aws.region == DEFAULTS.region
    assert gateway.limit_store.url is not None
    assert gateway.limit_store.url.get_secret_value().startswith("rediss://")
    assert gateway.limit_store.cluster is True

    for name, value in pool_env.items():
        monkeypatch.setenv(name, value)
    pool = PoolSettings()
    assert pool.provider == "ec2"
    (model,) = pool.models
    template_id, _template = synthesized.one("AWS::EC2::LaunchTemplate")
    assert model == PoolModel(
        name=DEFAULT_MODEL.name,
        min_agents=DEFAULT_MODEL.min_agents,
        max_agents=DEFAULT_MODEL.max_agents,
        warm_pool_size=0,
        volume_gib=DEFAULTS.root_volume_gib,
        launch_template=_ref(template_id),
    )
    assert pool.volume_gib == DEFAULTS.root_volume_gib == 200
    assert pool.spot_overprovision == DEFAULTS.spot_overprovision
    assert pool.on_demand_fallback is DEFAULTS.on_demand_fallback
    assert pool.ec2.pool_name == DEFAULTS.pool_name
    queue_id = _logical_id(synthesized, "AWS::SQS::Queue", "SpotEventsQueue")
    assert pool.interruption_queue_url == _ref(queue_id)
    assert {p.instance_type for p in pool.placements} == {
        option.instance_type for option in DEFAULTS.instance_types
    }
    assert pool.shared.tables.agents == gateway.shared.tables.agents


# --- network -------------------------------------------------------------------------------


def test_vpc_has_public_and_private_subnets_in_two_zones_and_flow_logs(
    synthesized: Synthesized,
) -> None:
    subnets = synthesized.resources("AWS::EC2::Subnet")
    private = _private_subnet_ids(synthesized)
    public = set(subnets) - private
    assert len(private) >= 2
    assert len(public) >= 2
    for group in (private, public):
        zones = {render(subnets[subnet]["Properties"]["AvailabilityZone"]) for subnet in group}
        assert len(zones) == len(group)
    for subnet in private:
        assert subnets[subnet]["Properties"]["MapPublicIpOnLaunch"] is False

    synthesized.template.has_resource_properties(
        "AWS::EC2::FlowLog",
        {"ResourceType": "VPC", "TrafficType": "ALL", "LogDestinationType": "cloud-watch-logs"},
    )


def test_pool_manager_launches_agents_into_the_private_subnets_only(
    synthesized: Synthesized,
) -> None:
    env = synthesized.container_env("pool-manager")
    subnets = json.loads(render(env["SPOTGATE_POOL_EC2__SUBNETS"]))
    private = _private_subnet_ids(synthesized)
    assert {value.removeprefix("<Ref:").removesuffix(">") for value in subnets.values()} == private
    all_subnets = synthesized.resources("AWS::EC2::Subnet")
    for zone, subnet in subnets.items():
        subnet_id = subnet.removeprefix("<Ref:").removesuffix(">")
        assert render(all_subnets[subnet_id]["Properties"]["AvailabilityZone"]) == zone
    placements = json.loads(render(env["SPOTGATE_POOL_PLACEMENTS"]))
    assert {placement["zone"] for placement in placements} == set(subnets)


# --- registry ------------------------------------------------------------------------------


def test_tables_match_the_registry_design(synthesized: Synthesized) -> None:
    tables = synthesized.resources("AWS::DynamoDB::Table")
    agents = tables[_table_id(synthesized, "Agents")]["Properties"]
    assert agents["TableName"] == f"{DEFAULTS.pool_name}-agents"
    assert agents["KeySchema"] == [{"AttributeName": "agent_id", "KeyType": "HASH"}]
    by_model, by_change = agents["GlobalSecondaryIndexes"]
    assert by_model["IndexName"] == BY_MODEL_INDEX
    assert by_model["KeySchema"] == [
        {"AttributeName": "model", "KeyType": "HASH"},
        {"AttributeName": "agent_id", "KeyType": "RANGE"},
    ]
    assert by_model["Projection"] == {"ProjectionType": "ALL"}
    # The change feed: what routing reads, ordered by change, nothing else.
    assert by_change["IndexName"] == BY_CHANGE_INDEX
    assert by_change["KeySchema"] == [
        {"AttributeName": "feed", "KeyType": "HASH"},
        {"AttributeName": "changed_at", "KeyType": "RANGE"},
    ]
    assert by_change["Projection"] == {
        "ProjectionType": "INCLUDE",
        "NonKeyAttributes": list(FEED_FIELDS),
    }
    assert {"AttributeName": "changed_at", "AttributeType": "N"} in agents["AttributeDefinitions"]
    assert agents["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}

    keys = tables[_table_id(synthesized, "Keys")]
    assert keys["Properties"]["KeySchema"] == [{"AttributeName": "key_id", "KeyType": "HASH"}]
    assert keys["Properties"]["PointInTimeRecoverySpecification"] == {
        "PointInTimeRecoveryEnabled": True
    }
    assert keys["DeletionPolicy"] == "Retain"

    demand = tables[_table_id(synthesized, "Demand")]["Properties"]
    assert demand["KeySchema"] == [
        {"AttributeName": "model", "KeyType": "HASH"},
        {"AttributeName": "gateway_id", "KeyType": "RANGE"},
    ]
    assert demand["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}

    usage = tables[_table_id(synthesized, "Usage")]
    assert usage["Properties"]["KeySchema"] == [
        {"AttributeName": "key_id", "KeyType": "HASH"},
        {"AttributeName": "period", "KeyType": "RANGE"},
    ]
    assert usage["Properties"]["TimeToLiveSpecification"] == {
        "AttributeName": "expires_at",
        "Enabled": True,
    }
    assert usage["DeletionPolicy"] == "Retain"  # billing records outlive the stack

    # Customers' files and batches: kept like the keys, each record gone at its expiry.
    batches = tables[_table_id(synthesized, "Batches")]
    properties = batches["Properties"]
    assert properties["TableName"] == f"{DEFAULTS.pool_name}-batches"
    assert properties["KeySchema"] == [
        {"AttributeName": "owner", "KeyType": "HASH"},
        {"AttributeName": "object_id", "KeyType": "RANGE"},
    ]
    (by_work,) = properties["GlobalSecondaryIndexes"]
    assert by_work == {
        "IndexName": BY_WORK_INDEX,
        "KeySchema": [
            {"AttributeName": "work", "KeyType": "HASH"},
            {"AttributeName": "object_id", "KeyType": "RANGE"},
        ],
        "Projection": {"ProjectionType": "ALL"},
    }
    assert {"AttributeName": "work", "AttributeType": "S"} in properties["AttributeDefinitions"]
    assert properties["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}
    assert properties["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert batches["DeletionPolicy"] == "Retain"
    for table in tables.values():
        assert table["Properties"]["BillingMode"] == "PAY_PER_REQUEST"


# --- events --------------------------------------------------------------------------------


def test_ec2_events_reach_an_encrypted_queue_with_a_dead_letter_queue(
    synthesized: Synthesized,
) -> None:
    queue_id = _logical_id(synthesized, "AWS::SQS::Queue", "SpotEventsQueue")
    dlq_id = _logical_id(synthesized, "AWS::SQS::Queue", "SpotEventsDeadLetters")
    queues = synthesized.resources("AWS::SQS::Queue")
    queue = queues[queue_id]["Properties"]
    assert queue["SqsManagedSseEnabled"] is True
    assert queues[dlq_id]["Properties"]["SqsManagedSseEnabled"] is True
    assert queue["RedrivePolicy"]["deadLetterTargetArn"] == {"Fn::GetAtt": [dlq_id, "Arn"]}

    rules = [
        rule["Properties"]
        for rule in synthesized.resources("AWS::Events::Rule").values()
        if "EventPattern" in rule["Properties"]
    ]
    assert len(rules) == 1
    (rule,) = rules
    assert rule["EventPattern"] == EC2_EVENT_PATTERN
    assert set(rule["EventPattern"]["detail-type"]) == {
        INTERRUPTION_DETAIL_TYPE,
        REBALANCE_DETAIL_TYPE,
        STATE_CHANGE_DETAIL_TYPE,
    }
    assert rule["Targets"][0]["Arn"] == {"Fn::GetAtt": [queue_id, "Arn"]}
    # EventBridge may send, and only over TLS for everyone else.
    synthesized.template.has_resource_properties(
        "AWS::SQS::QueuePolicy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "Action": Match.array_with(["sqs:SendMessage"]),
                                "Principal": {"Service": "events.amazonaws.com"},
                            }
                        )
                    ]
                )
            }
        },
    )


# --- GPU pool ------------------------------------------------------------------------------


def test_launch_template_requires_imdsv2_and_encrypts_a_sized_root_volume(
    synthesized: Synthesized,
) -> None:
    _template_id, template = synthesized.one("AWS::EC2::LaunchTemplate")
    data = template["Properties"]["LaunchTemplateData"]
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["MetadataOptions"]["HttpPutResponseHopLimit"] == 2
    (root,) = data["BlockDeviceMappings"]
    assert root["DeviceName"] == DEFAULTS.ami_root_device_name
    assert root["Ebs"]["Encrypted"] is True
    assert root["Ebs"]["VolumeSize"] == DEFAULTS.root_volume_gib >= 100
    assert data["InstanceInitiatedShutdownBehavior"] == "terminate"
    image_parameter = data["ImageId"]["Ref"]
    parameter = synthesized.raw["Parameters"][image_parameter]
    assert parameter["Type"] == "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"
    assert parameter["Default"] == DEFAULTS.ami_ssm_parameter
    assert "InstanceType" not in data  # the pool manager picks it per placement
    name = template["Properties"]["LaunchTemplateName"]
    assert (
        name
        == f"{DEFAULTS.pool_name}-agent-Qwen-Qwen3-4B"
        == DEFAULTS.launch_template_name(DEFAULT_MODEL)
    )


def test_agents_role_writes_only_the_agents_table(synthesized: Synthesized) -> None:
    _profile_id, profile = synthesized.one("AWS::IAM::InstanceProfile")
    (role,) = profile["Properties"]["Roles"]
    found = _policy_statements_of_role(synthesized, role["Ref"])
    agents_arn = {"Fn::GetAtt": [_table_id(synthesized, "Agents"), "Arn"]}
    dynamodb = [s for s in found if any(a.startswith("dynamodb:") for a in as_list(s["Action"]))]
    assert len(dynamodb) == 1
    assert set(as_list(dynamodb[0]["Action"])) <= {
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:GetItem",
    }
    assert as_list(dynamodb[0]["Resource"]) == [agents_arn]
    # Its own row only: the key it registers under is its instance's ARN.
    assert dynamodb[0]["Condition"] == {
        "ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["${ec2:SourceInstanceARN}"]}
    }
    actions = {action for statement in found for action in as_list(statement["Action"])}
    assert not any(
        action.startswith(("secretsmanager:", "kms:", "ec2:", "iam:")) for action in actions
    )
    assert actions <= {
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:GetItem",
        "s3:GetObject",  # staged models (a test of its own)
        "s3:ListBucket",
        "ecr:GetAuthorizationToken",  # its image
        "ecr:BatchCheckLayerAvailability",
        "ecr:GetDownloadUrlForLayer",
        "ecr:BatchGetImage",
        "logs:CreateLogStream",
        "logs:PutLogEvents",
        "ssm:GetParameter",  # the gateways' public keys, and only those (a test of its own)
    }


def test_agents_read_staged_models_from_the_pools_private_bucket(
    synthesized: Synthesized,
) -> None:
    [(bucket_id, bucket)] = [
        (i, b) for i, b in synthesized.resources("AWS::S3::Bucket").items() if "Models" in i
    ]
    properties = bucket["Properties"]
    assert properties["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    assert properties["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert bucket["DeletionPolicy"] == "Retain"
    _profile_id, profile = synthesized.one("AWS::IAM::InstanceProfile")
    (role,) = profile["Properties"]["Roles"]
    reads = [
        statement
        for statement in _policy_statements_of_role(synthesized, role["Ref"])
        if "s3:GetObject" in as_list(statement["Action"])
    ]
    assert len(reads) == 1
    assert {render(resource) for resource in as_list(reads[0]["Resource"])} == {
        f"<{bucket_id}.Arn>",
        f"<{bucket_id}.Arn>/*",
    }
    assert render(synthesized.raw["Outputs"]["ModelBucket"]["Value"]) == f"<Ref:{bucket_id}>"


def test_agents_admit_only_the_gateways(synthesized: Synthesized) -> None:
    ingress = synthesized.resources("AWS::EC2::SecurityGroupIngress")
    to_agents = [
        rule["Properties"]
        for rule in ingress.values()
        if "GpuPoolSecurityGroup" in render(rule["Properties"]["GroupId"])
    ]
    assert len(to_agents) == 1
    assert to_agents[0]["FromPort"] == to_agents[0]["ToPort"] == 8000
    assert "Gateway" in render(to_agents[0]["SourceSecurityGroupId"])


# --- IAM -----------------------------------------------------------------------------------


def test_no_policy_allows_wildcard_actions(synthesized: Synthesized) -> None:
    checked = 0
    for holder, statement in statements(synthesized.raw):
        checked += 1
        if statement["Effect"] != "Allow":
            continue  # the TLS-only denies say `sqs:*` / `s3:*` on purpose
        actions = as_list(statement.get("Action", []))
        resources = as_list(statement.get("Resource", []))
        assert not (actions == ["*"] and resources == ["*"]), holder
        for action in actions:
            assert "*" not in action, f"{holder}: {action}"
    assert checked > 20


def test_pool_manager_may_only_launch_stop_start_and_end_its_own_pool(
    synthesized: Synthesized,
) -> None:
    found = _policy_statements_of_role(synthesized, _task_role(synthesized, "pool-manager"))
    by_sid = {statement["Sid"]: statement for statement in found}
    ec2_actions = {
        action
        for statement in found
        for action in as_list(statement["Action"])
        if action.startswith("ec2:")
    }
    assert ec2_actions == {
        "ec2:CreateFleet",
        "ec2:RunInstances",
        "ec2:TerminateInstances",
        "ec2:StopInstances",
        "ec2:StartInstances",
        "ec2:DescribeInstances",
        "ec2:DescribeSpotPriceHistory",
        "ec2:DescribeLaunchTemplates",
        "ec2:CreateTags",
    }
    pool = DEFAULTS.pool_name
    launch = by_sid["LaunchPoolInstances"]
    template_id, _template = synthesized.one("AWS::EC2::LaunchTemplate")
    assert launch["Condition"]["StringEquals"] == {
        f"aws:RequestTag/{POOL_TAG}": pool,
        "ec2:InstanceType": [option.instance_type for option in DEFAULTS.instance_types],
    }
    (template_arn,) = as_list(launch["Condition"]["ArnLike"]["ec2:LaunchTemplate"])
    assert render(template_arn).endswith(f":launch-template/<Ref:{template_id}>")
    image = by_sid["TemplateImageOnly"]
    assert render(image["Resource"]).endswith(":image/*")
    assert image["Condition"] == {"Bool": {"ec2:IsLaunchTemplateResource": "true"}}
    assert [render(resource) for resource in as_list(launch["Resource"])] == [
        f"arn:<Ref:AWS::Partition>:ec2:{DEFAULTS.region}:<Ref:AWS::AccountId>:instance/*"
    ]
    terminate = by_sid["TerminatePoolInstances"]
    assert terminate["Action"] == "ec2:TerminateInstances"
    assert terminate["Condition"] == {"StringEquals": {f"aws:ResourceTag/{POOL_TAG}": pool}}
    tags = by_sid["TagAtLaunchOnly"]
    assert tags["Condition"]["StringEquals"]["ec2:CreateAction"] == ["CreateFleet", "RunInstances"]
    # The warm pool: stop and start the pool's instances, and tag them with the stop and start
    # times and the boot's kind, no other key (the pool's and model's tags stay as launched).
    instances = f"arn:<Ref:AWS::Partition>:ec2:{DEFAULTS.region}:<Ref:AWS::AccountId>:instance/*"
    own_pool = {f"aws:ResourceTag/{POOL_TAG}": pool}
    stop_start = by_sid["StopStartPoolInstances"]
    assert stop_start["Action"] == ["ec2:StopInstances", "ec2:StartInstances"]
    assert render(stop_start["Resource"]) == instances
    assert stop_start["Condition"] == {"StringEquals": own_pool}
    warm_tags = by_sid["TagWarmPoolInstances"]
    assert warm_tags["Action"] == "ec2:CreateTags"
    assert render(warm_tags["Resource"]) == instances
    assert warm_tags["Condition"] == {
        "StringEquals": own_pool,
        "ForAllValues:StringEquals": {"aws:TagKeys": [STOPPED_AT_TAG, STARTED_AT_TAG, BOOT_TAG]},
    }
    assert {sid for sid, s in by_sid.items() if "ec2:CreateTags" in as_list(s["Action"])} == {
        "TagAtLaunchOnly",
        "TagWarmPoolInstances",
    }
    # Every action on an existing instance is bound to the pool's own.
    for statement in found:
        if set(as_list(statement["Action"])) & {
            "ec2:TerminateInstances",
            "ec2:StopInstances",
            "ec2:StartInstances",
        }:
            assert statement["Condition"]["StringEquals"] == own_pool
    # Only the Describe calls run on every resource: IAM cannot scope them.
    everywhere = [s for s in found if "*" in as_list(s["Resource"])]
    assert [s["Action"] for s in everywhere] == [
        ["ec2:DescribeInstances", "ec2:DescribeSpotPriceHistory", "ec2:DescribeLaunchTemplates"]
    ]

    from_template = [render(r) for r in as_list(by_sid["LaunchFromAgentTemplate"]["Resource"])]
    assert any(template_id in arn for arn in from_template)
    assert all("subnet/" not in arn or "private" in arn for arn in from_template)

    pass_role = by_sid["PassAgentRole"]
    _profile_id, profile = synthesized.one("AWS::IAM::InstanceProfile")
    agent_role = profile["Properties"]["Roles"][0]["Ref"]
    assert pass_role["Resource"] == {"Fn::GetAtt": [agent_role, "Arn"]}
    assert pass_role["Condition"] == {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}
    assert [s for s in found if "iam:PassRole" in as_list(s["Action"])] == [pass_role]

    queue_id = _logical_id(synthesized, "AWS::SQS::Queue", "SpotEventsQueue")
    sqs = by_sid["ConsumeEc2Events"]
    assert set(sqs["Action"]) == {"sqs:ReceiveMessage", "sqs:DeleteMessage"}
    assert sqs["Resource"] == {"Fn::GetAtt": [queue_id, "Arn"]}

    dynamodb_resources = {
        render(resource)
        for statement in found
        if any(action.startswith("dynamodb:") for action in as_list(statement["Action"]))
        for resource in as_list(statement["Resource"])
    }
    assert dynamodb_resources == {
        f"<{_table_id(synthesized, 'Agents')}.Arn>",
        f"<{_table_id(synthesized, 'Demand')}.Arn>",
        f"<{_table_id(synthesized, 'Launches')}.Arn>",
    }
    # A gone entry is deleted before its instance starts again from the warm pool.
    agents = f"<{_table_id(synthesized, 'Agents')}.Arn>"
    on_agents = {
        action
        for statement in found
        if [render(resource) for resource in as_list(statement["Resource"])] == [agents]
        for action in as_list(statement["Action"])
    }
    assert on_agents == {
        "dynamodb:Scan",
        "dynamodb:GetItem",
        "dynamodb:UpdateItem",
        "dynamodb:DeleteItem",
    }


def test_the_pool_manager_reads_demand_and_writes_its_forecasts_there(
    synthesized: Synthesized,
) -> None:
    found = _policy_statements_of_role(synthesized, _task_role(synthesized, "pool-manager"))
    demand = f"<{_table_id(synthesized, 'Demand')}.Arn>"
    on_demand = {
        action
        for statement in found
        if [render(resource) for resource in as_list(statement["Resource"])] == [demand]
        for action in as_list(statement["Action"])
    }
    assert on_demand == {"dynamodb:Scan", "dynamodb:PutItem", "dynamodb:DeleteItem"}


def test_gateway_reads_keys_and_agents_and_writes_only_demand_usage_batches_and_files(
    synthesized: Synthesized,
) -> None:
    found = _policy_statements_of_role(synthesized, _task_role(synthesized, "gateway"))
    writes = {
        action
        for statement in found
        for action in as_list(statement["Action"])
        if action.split(":")[1].startswith(("Put", "Update", "Delete", "BatchWrite"))
    }
    assert writes == {
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:DeleteItem",  # files and batches only (below)
        "ssm:PutParameter",
        "s3:PutObject",
        "s3:DeleteObject",
    }
    deletes = [s for s in found if "dynamodb:DeleteItem" in as_list(s["Action"])]
    assert [render(s["Resource"]) for s in deletes] == [
        f"<{_table_id(synthesized, 'Batches')}.Arn>"
    ]
    (publish,) = [s for s in found if s.get("Sid") == "PublishDemand"]
    assert set(publish["Action"]) == {"dynamodb:PutItem", "dynamodb:GetItem"}  # + forecasts
    assert render(publish["Resource"]) == f"<{_table_id(synthesized, 'Demand')}.Arn>"
    (adds,) = [s for s in found if s["Action"] == "dynamodb:UpdateItem"]
    assert render(adds["Resource"]) == f"<{_table_id(synthesized, 'Usage')}.Arn>"
    # Agents are read through the change feed only: no scan of the table, whatever its size.
    (reads,) = [s for s in found if s.get("Sid") == "ReadAgents"]
    assert reads["Action"] == "dynamodb:Query"
    assert render(reads["Resource"]) == (
        f"<{_table_id(synthesized, 'Agents')}.Arn>/index/{BY_CHANGE_INDEX}"
    )


def test_only_the_pool_manager_writes_launch_records_and_the_gateways_only_read_them(
    synthesized: Synthesized,
) -> None:
    launches = f"<{_table_id(synthesized, 'Launches')}.Arn>"
    table = synthesized.resources("AWS::DynamoDB::Table")[_table_id(synthesized, "Launches")]
    assert table["Properties"]["KeySchema"] == [{"AttributeName": "agent_id", "KeyType": "HASH"}]
    on_launches: dict[str, set[str]] = {}
    for policy in synthesized.resources("AWS::IAM::Policy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            resources = [render(resource) for resource in as_list(statement["Resource"])]
            if any(resource.startswith(launches) for resource in resources):
                for role in policy["Properties"]["Roles"]:
                    on_launches.setdefault(role["Ref"], set()).update(as_list(statement["Action"]))
    _profile_id, profile = synthesized.one("AWS::IAM::InstanceProfile")
    (agents_role,) = profile["Properties"]["Roles"]
    assert on_launches == {
        _task_role(synthesized, "pool-manager"): {"dynamodb:PutItem", "dynamodb:DeleteItem"},
        _task_role(synthesized, "gateway"): {"dynamodb:BatchGetItem"},
    }
    assert agents_role["Ref"] not in on_launches  # an agent cannot vouch for itself
    for container in ("gateway", "pool-manager"):
        env = synthesized.container_env(container)
        assert render(env["SPOTGATE_TABLES__LAUNCHES"]) == (
            f"<Ref:{_table_id(synthesized, 'Launches')}>"
        )


def test_only_the_gateway_keeps_files_and_batches_and_only_what_it_needs(
    synthesized: Synthesized,
) -> None:
    gateway = _task_role(synthesized, "gateway")
    by_sid = {s["Sid"]: s for s in _policy_statements_of_role(synthesized, gateway) if "Sid" in s}
    batches = f"<{_table_id(synthesized, 'Batches')}.Arn>"
    bucket = f"<{_files_bucket_id(synthesized)}.Arn>"
    granted = {
        sid: (set(as_list(by_sid[sid]["Action"])), render(by_sid[sid]["Resource"]))
        for sid in ("KeepBatches", "FindBatchWork", "KeepFiles", "ListFiles")
    }
    assert granted == {
        "KeepBatches": (
            {
                "dynamodb:GetItem",
                "dynamodb:PutItem",
                "dynamodb:UpdateItem",
                "dynamodb:DeleteItem",
                "dynamodb:Query",
                "dynamodb:Scan",
            },
            batches,
        ),
        # The index only answers queries: no item action on it.
        "FindBatchWork": ({"dynamodb:Query"}, f"{batches}/index/{BY_WORK_INDEX}"),
        "KeepFiles": ({"s3:GetObject", "s3:PutObject", "s3:DeleteObject"}, f"{bucket}/*"),
        "ListFiles": ({"s3:ListBucket"}, bucket),
    }
    # No other role (pool manager, agents, functions) may touch them.
    holders = {
        role["Ref"]
        for policy in synthesized.resources("AWS::IAM::Policy").values()
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
        if any(
            render(resource).startswith((batches, bucket))
            for resource in as_list(statement["Resource"])
        )
        for role in policy["Properties"]["Roles"]
    }
    assert holders == {gateway}


def test_the_files_bucket_is_private_encrypted_tls_only_logged_and_kept(
    synthesized: Synthesized,
) -> None:
    bucket_id = _files_bucket_id(synthesized)
    bucket = synthesized.resources("AWS::S3::Bucket")[bucket_id]
    properties = bucket["Properties"]
    assert properties["BucketEncryption"]["ServerSideEncryptionConfiguration"] == [
        {"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}
    ]
    assert properties["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    assert properties["OwnershipControls"] == {
        "Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]
    }
    assert bucket["DeletionPolicy"] == bucket["UpdateReplacePolicy"] == "Retain"
    # Its access logs go beside the load balancer's, which S3 may write there by policy alone.
    access_logs = _logical_id(synthesized, "AWS::S3::Bucket", "GatewayAccessLogs")
    assert properties["LoggingConfiguration"] == {
        "DestinationBucketName": {"Ref": access_logs},
        "LogFilePrefix": "files/",
    }
    by_bucket = {
        render(policy["Properties"]["Bucket"]): policy["Properties"]["PolicyDocument"]["Statement"]
        for policy in synthesized.resources("AWS::S3::BucketPolicy").values()
    }
    (delivery,) = [
        s
        for s in by_bucket[f"<Ref:{access_logs}>"]
        if s.get("Principal") == {"Service": "logging.s3.amazonaws.com"}
    ]
    assert render(delivery["Resource"]) == f"<{access_logs}.Arn>/files/*"
    assert delivery["Condition"]["ArnLike"] == {"aws:SourceArn": {"Fn::GetAtt": [bucket_id, "Arn"]}}
    # Anyone, the gateway included, over TLS only.
    (deny,) = [s for s in by_bucket[f"<Ref:{bucket_id}>"] if s["Effect"] == "Deny"]
    assert deny["Action"] == "s3:*"
    assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert {render(r) for r in deny["Resource"]} == {f"<{bucket_id}.Arn>", f"<{bucket_id}.Arn>/*"}


# --- gateway -------------------------------------------------------------------------------


def test_the_gateway_connects_only_to_agents_inside_the_vpc(synthesized: Synthesized) -> None:
    networks = synthesized.container_env("gateway")["SPOTGATE_GATEWAY_AGENT_NETWORKS"]
    [vpc_id] = synthesized.resources("AWS::EC2::VPC")
    assert render(networks) == f'["<{vpc_id}.CidrBlock>"]'


def test_a_revision_reaches_the_agents_and_an_unpinned_model_is_a_warning(
    synthesized: Synthesized, tmp_path: Path
) -> None:
    # The default model is pinned.
    assert not Annotations.from_stack(synthesized.stack).find_warning(
        "*", Match.string_like_regexp("has no revision")
    )
    _id, template = synthesized.one("AWS::EC2::LaunchTemplate")
    boot = render(template["Properties"]["LaunchTemplateData"]["UserData"])
    assert f"SPOTGATE_AGENT_VLLM__REVISION={DEFAULT_MODEL.revision}\n" in boot
    unpinned = synthesize(
        tmp_path, {**PLAIN_HTTP, "models": [{"name": "m", "model": "org/newest"}]}
    )
    warnings = Annotations.from_stack(unpinned.stack).find_warning(
        "*", Match.string_like_regexp("model m \\(org/newest\\) has no revision")
    )
    assert len(warnings) == 1
    _id, template = unpinned.one("AWS::EC2::LaunchTemplate")
    assert "SPOTGATE_AGENT_VLLM__REVISION" not in render(
        template["Properties"]["LaunchTemplateData"]["UserData"]
    )


def test_plain_http_is_synthesized_only_when_asked_and_then_with_a_warning(
    synthesized: Synthesized,
) -> None:
    warnings = Annotations.from_stack(synthesized.stack).find_warning(
        "*", Match.string_like_regexp("allowPlainHttp: the gateway listens on plain HTTP")
    )
    assert len(warnings) == 1


def test_only_the_gateways_write_the_public_keys_and_the_agents_read_them_with_iam(
    synthesized: Synthesized,
) -> None:
    parameter = "arn:<Ref:AWS::Partition>:ssm:us-east-1:<Ref:AWS::AccountId>:parameter/"
    parameter += "spotgate/gateway-jwks"
    gateway = _policy_statements_of_role(synthesized, _task_role(synthesized, "gateway"))
    [publish] = [s for s in gateway if s.get("Sid") == "PublishPublicKeys"]
    assert (publish["Action"], render(publish["Resource"])) == ("ssm:PutParameter", parameter)
    env = synthesized.container_env("gateway")
    assert env["SPOTGATE_GATEWAY_JWKS_PARAMETER"] == "/spotgate/gateway-jwks"

    _profile_id, profile = synthesized.one("AWS::IAM::InstanceProfile")
    (role,) = profile["Properties"]["Roles"]
    [agent] = [
        s
        for s in _policy_statements_of_role(synthesized, role["Ref"])
        if s.get("Sid") == "GatewayPublicKeys"
    ]
    assert (agent["Action"], render(agent["Resource"])) == ("ssm:GetParameter", parameter)


def _gateway_ingress(synthesized: Synthesized) -> list[dict[str, Any]]:
    """The ingress rules of the gateway tasks' security group."""
    return [
        rule["Properties"]
        for rule in synthesized.resources("AWS::EC2::SecurityGroupIngress").values()
        if "GatewayServiceSecurityGroup" in render(rule["Properties"]["GroupId"])
    ]


def test_readiness_and_metrics_are_on_a_port_the_load_balancer_never_forwards(
    synthesized: Synthesized,
) -> None:
    env = synthesized.container_env("gateway")
    ops_port = int(env["SPOTGATE_GATEWAY_OPS_PORT"])
    assert ops_port != int(env["SPOTGATE_GATEWAY_PORT"])
    _id, group = synthesized.one("AWS::ElasticLoadBalancingV2::TargetGroup")
    assert group["Properties"]["Port"] == int(env["SPOTGATE_GATEWAY_PORT"])
    # Only the load balancer reaches the tasks, and only on the traffic port.
    [ingress] = _gateway_ingress(synthesized)
    assert ingress["FromPort"] == ingress["ToPort"] == int(env["SPOTGATE_GATEWAY_PORT"])
    assert "LoadBalancer" in render(ingress["SourceSecurityGroupId"])
    # No path rule stands in for it: the gateway's traffic port has no such routes at all.
    assert not synthesized.resources("AWS::ElasticLoadBalancingV2::ListenerRule")
    # The container's own check reads liveness on the operations port.
    health = " ".join(synthesized.container("gateway")["HealthCheck"]["Command"])
    assert f"127.0.0.1:{ops_port}/healthz" in health


def test_the_operations_port_admits_only_the_configured_scraper(tmp_path: Path) -> None:
    scraper = "sg-0123456789abcdef0"
    scraped = synthesize(tmp_path, {**PLAIN_HTTP, "opsScraperSecurityGroup": scraper})
    ops_port = int(scraped.container_env("gateway")["SPOTGATE_GATEWAY_OPS_PORT"])
    by_port = {rule["FromPort"]: rule for rule in _gateway_ingress(scraped)}
    assert set(by_port) == {8080, ops_port}
    assert by_port[ops_port]["ToPort"] == ops_port
    assert by_port[ops_port]["SourceSecurityGroupId"] == scraper
    assert "LoadBalancer" in render(by_port[8080]["SourceSecurityGroupId"])


def test_load_balancer_keeps_websockets_open_and_drains_like_the_gateway(
    synthesized: Synthesized,
) -> None:
    _id, balancer = synthesized.one("AWS::ElasticLoadBalancingV2::LoadBalancer")
    attributes = {a["Key"]: a["Value"] for a in balancer["Properties"]["LoadBalancerAttributes"]}
    assert attributes["idle_timeout.timeout_seconds"] == str(DEFAULTS.alb_idle_timeout_seconds)
    assert int(attributes["idle_timeout.timeout_seconds"]) >= 3600
    assert attributes["access_logs.s3.enabled"] == "true"
    assert attributes["routing.http.drop_invalid_header_fields.enabled"] == "true"
    assert balancer["Properties"]["Scheme"] == "internet-facing"

    _id, group = synthesized.one("AWS::ElasticLoadBalancingV2::TargetGroup")
    target_attributes = {a["Key"]: a["Value"] for a in group["Properties"]["TargetGroupAttributes"]}
    drain = synthesized.container_env("gateway")["SPOTGATE_GATEWAY_SHUTDOWN_GRACE_SECONDS"]
    assert target_attributes["deregistration_delay.timeout_seconds"] == drain
    assert group["Properties"]["HealthCheckPath"] == "/healthz"
    assert group["Properties"]["TargetType"] == "ip"
    # SIGKILL comes after the drain, and after the streams still open have heard going_away.
    stop_timeout = synthesized.container("gateway")["StopTimeout"]
    assert stop_timeout >= int(drain) + GOING_AWAY_WRITE_SECONDS + 5
    # The ALB closes idle connections, never the gateway (that would be a 502).
    keepalive = synthesized.container_env("gateway")["SPOTGATE_GATEWAY_KEEPALIVE_SECONDS"]
    assert int(keepalive) > int(attributes["idle_timeout.timeout_seconds"])

    listeners = synthesized.resources("AWS::ElasticLoadBalancingV2::Listener")
    assert [listener["Properties"]["Port"] for listener in listeners.values()] == [80]


def test_gateway_scales_on_cpu_and_on_requests_per_target(synthesized: Synthesized) -> None:
    _id, target = synthesized.one("AWS::ApplicationAutoScaling::ScalableTarget")
    assert target["Properties"]["MinCapacity"] == DEFAULTS.gateway_min_tasks
    assert target["Properties"]["MaxCapacity"] == DEFAULTS.gateway_max_tasks
    metrics = {
        policy["Properties"]["TargetTrackingScalingPolicyConfiguration"][
            "PredefinedMetricSpecification"
        ]["PredefinedMetricType"]
        for policy in synthesized.resources("AWS::ApplicationAutoScaling::ScalingPolicy").values()
    }
    assert metrics == {"ECSServiceAverageCPUUtilization", "ALBRequestCountPerTarget"}


def test_gateway_gets_its_signing_key_from_secrets_manager(synthesized: Synthesized) -> None:
    secret_id, _secret = synthesized.one("AWS::SecretsManager::Secret")
    container = synthesized.container("gateway")
    assert container["Secrets"] == [
        {"Name": "SPOTGATE_GATEWAY_TOKEN__SIGNING_KEY_PEM", "ValueFrom": {"Ref": secret_id}}
    ]
    assert "SPOTGATE_GATEWAY_TOKEN__SIGNING_KEY_PEM" not in synthesized.container_env("gateway")
    key_id, key = synthesized.one("Custom::SpotgateSigningKey")
    assert key["Properties"]["SecretId"] == {"Ref": secret_id}
    services = synthesized.resources("AWS::ECS::Service")
    gateway_service = next(s for i, s in services.items() if i.startswith("Gateway"))
    assert key_id in gateway_service["DependsOn"]
    # Only the gateway's execution role (and the key's generator) touch the secret.
    readers = {
        holder
        for holder, statement in statements(synthesized.raw)
        if any(action.startswith("secretsmanager:") for action in as_list(statement["Action"]))
    }
    assert len(readers) == 2
    assert any(reader.startswith("GatewayTaskExecutionRole") for reader in readers)


def test_services_run_the_spotgate_commands(synthesized: Synthesized) -> None:
    assert synthesized.container("gateway")["Command"] == ["gateway"]
    assert synthesized.container("pool-manager")["Command"] == ["pool", "run"]
    gateway_image = synthesized.container("gateway")["Image"]
    assert synthesized.container("pool-manager")["Image"] == gateway_image
    assets = json.loads((synthesized.outdir / "Spotgate.assets.json").read_text())
    built = sorted(image["source"]["dockerFile"] for image in assets["dockerImages"].values())
    assert built == ["infra/cdk/Dockerfile", "infra/cdk/agent.Dockerfile"]
    dockerfile = (CDK_DIR / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim@sha256:[0-9a-f]{64}$", dockerfile, re.M)
    assert "pip install --require-hashes -r requirements/service.lock" in dockerfile
    assert "pip install --no-deps --no-build-isolation ." in dockerfile
    assert 'ENTRYPOINT ["spotgate"]' in dockerfile


def test_pool_manager_runs_exactly_one_task(synthesized: Synthesized) -> None:
    services = synthesized.resources("AWS::ECS::Service")
    (pool,) = [s["Properties"] for i, s in services.items() if i.startswith("PoolManager")]
    assert pool["DesiredCount"] == 1
    assert pool["DeploymentConfiguration"]["MaximumPercent"] == 100
    assert pool["DeploymentConfiguration"]["MinimumHealthyPercent"] == 0
    for service in services.values():
        network = service["Properties"]["NetworkConfiguration"]["AwsvpcConfiguration"]
        assert network["AssignPublicIp"] == "DISABLED"
        subnet_ids = {
            render(subnet).removeprefix("<Ref:").removesuffix(">") for subnet in network["Subnets"]
        }
        assert subnet_ids == _private_subnet_ids(synthesized)


# --- observability -------------------------------------------------------------------------


def test_every_log_group_has_a_retention(synthesized: Synthesized) -> None:
    groups = synthesized.resources("AWS::Logs::LogGroup")
    assert len(groups) >= 6
    for group in groups.values():
        assert group["Properties"]["RetentionInDays"] == DEFAULTS.log_retention_days
    for function in synthesized.resources("AWS::Lambda::Function").values():
        logged_to = function["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
        assert logged_to in groups
    for name in ("gateway", "pool-manager"):
        options = synthesized.container(name)["LogConfiguration"]["Options"]
        assert options["awslogs-group"]["Ref"] in groups


def test_a_cloudwatch_dashboard_shows_the_alarms_and_their_metrics(
    synthesized: Synthesized,
) -> None:
    _id, dashboard = synthesized.one("AWS::CloudWatch::Dashboard")
    assert dashboard["Properties"]["DashboardName"] == "spotgate-pool"
    body = render(dashboard["Properties"]["DashboardBody"])
    for shown in ("ReadyAgents", "QueuedStreams", "SpotInterruptions",
                  "ApproximateAgeOfOldestMessage", "ApproximateNumberOfMessagesVisible",
                  '"type":"alarm"'):  # fmt: skip
        assert shown in body, shown


def test_alarms_on_ready_agents_queue_time_and_interruptions(synthesized: Synthesized) -> None:
    alarms = {
        logical_id.removeprefix("Monitoring"): alarm["Properties"]
        for logical_id, alarm in synthesized.resources("AWS::CloudWatch::Alarm").items()
    }
    names = {name: props for prefix in ("NoReadyAgents", "HighQueueTime", "InterruptionRate",
             "StartFailures", "StalledEvents", "DeadLetters") for name, props in alarms.items()
             if name.startswith(prefix)}  # fmt: skip
    assert len(names) == len(alarms) == 6

    def metric_names(props: dict[str, Any]) -> set[str]:
        if "MetricName" in props:
            return {props["MetricName"]}
        return {
            query["MetricStat"]["Metric"]["MetricName"]
            for query in props["Metrics"]
            if "MetricStat" in query
        }

    by_prefix = {
        prefix: next(props for name, props in names.items() if name.startswith(prefix))
        for prefix in ("NoReadyAgents", "HighQueueTime", "InterruptionRate", "StartFailures")
    }
    assert metric_names(by_prefix["NoReadyAgents"]) == {"ReadyAgents", "QueuedStreams"}
    assert metric_names(by_prefix["HighQueueTime"]) == {"QueuedStreams"}
    assert metric_names(by_prefix["InterruptionRate"]) == {"SpotInterruptions"}
    assert by_prefix["InterruptionRate"]["Threshold"] == DEFAULTS.interruption_alarm_per_hour

    assert metric_names(by_prefix["StartFailures"]) == {"LaunchesHeld"}
    filters = {
        f["Properties"]["MetricTransformations"][0]["MetricName"]: f["Properties"]
        for f in synthesized.resources("AWS::Logs::MetricFilter").values()
    }
    assert {name: f["FilterPattern"] for name, f in filters.items()} == {
        "SpotInterruptions": '{ $.event = "spot interruption: draining" }',
        "LaunchesHeld": '{ $.event = "launches held: agents keep failing to start" }',
    }
    pool_logs = synthesized.container("pool-manager")["LogConfiguration"]["Options"][
        "awslogs-group"
    ]
    assert [f["LogGroupName"] for f in filters.values()] == [pool_logs, pool_logs]

    _id, function = next(
        (i, f)
        for i, f in synthesized.resources("AWS::Lambda::Function").items()
        if "RegistryMetrics" in i
    )
    variables = function["Properties"]["Environment"]["Variables"]
    assert json.loads(variables["MODELS"]) == [DEFAULT_MODEL.name]
    assert variables["NAMESPACE"] == "spotgate"


def test_outputs_name_the_urls_tables_and_queue(synthesized: Synthesized) -> None:
    outputs = synthesized.raw["Outputs"]
    for name in ("GatewayUrl", "ChatUrl", "AgentsTable", "KeysTable", "DemandTable",
                 "InterruptionQueueUrl", "CreateKeyCommand", "ClusterName",
                 "PoolManagerService", "AgentLogGroup", "AccessLogsBucket"):  # fmt: skip
        assert name in outputs
    assert render(outputs["ChatUrl"]["Value"]) == render(outputs["GatewayUrl"]["Value"]) + "/"
    command = render(outputs["CreateKeyCommand"]["Value"])
    assert "SPOTGATE_TABLES__KEYS=<Ref:" in command
    assert command.endswith("spotgate keys create --name first")
