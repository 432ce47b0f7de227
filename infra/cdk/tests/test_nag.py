"""cdk-nag's AWS Solutions checks pass: every finding is fixed or acknowledged with a reason."""

from __future__ import annotations

import json
from typing import Any

from aws_cdk import Validations
from conftest import Synthesized, cfn_lint_errors

MAX_REASON_CHARS = 160


def _acknowledgements(synthesized: Synthesized) -> dict[str, dict[str, str]]:
    found: dict[str, dict[str, str]] = {}
    for construct in synthesized.stack.node.find_all():
        for entry in construct.node.metadata:
            if entry.type == Validations.ACKNOWLEDGED_RULES_METADATA_KEY:
                found.setdefault(construct.node.path, {}).update(entry.data)
    return found


def test_synthesis_passes_the_aws_solutions_checks(synthesized: Synthesized) -> None:
    assert synthesized.validation_error is None, synthesized.validation_error
    report = json.loads((synthesized.outdir / "validation-report.json").read_text())
    violations: list[Any] = [
        violation
        for plugin in report["pluginReports"]
        for violation in plugin.get("violations", [])
    ]
    assert violations == []


def test_no_error_or_warning_annotations(synthesized: Synthesized) -> None:
    manifest = json.loads((synthesized.outdir / "manifest.json").read_text())
    annotations = [
        (path, entry["type"], entry["data"])
        for artifact in manifest["artifacts"].values()
        for path, entries in (artifact.get("metadata") or {}).items()
        for entry in entries
        if entry["type"] in ("aws:cdk:error", "aws:cdk:warning")
    ]
    assert annotations == []


def test_every_acknowledgement_is_a_nag_rule_with_a_one_line_reason(
    synthesized: Synthesized,
) -> None:
    acknowledged = _acknowledgements(synthesized)
    ours = {
        (path, rule): reason
        for path, rules in acknowledged.items()
        for rule, reason in rules.items()
        # Others (`CloudFormation-Validate::…`) are aws-cdk-lib's own, on its own constructs.
        if rule.startswith("AwsSolutions::")
    }
    assert ours, "the stack acknowledges its known findings"
    for (path, rule), reason in ours.items():
        assert rule.startswith("AwsSolutions::AwsSolutions-"), (path, rule)
        assert reason.strip(), (path, rule)
        assert "\n" not in reason, (path, rule)
        assert len(reason) <= MAX_REASON_CHARS, (path, rule, len(reason))


def test_the_template_passes_cfn_lint(synthesized: Synthesized) -> None:
    template = synthesized.outdir / synthesized.stack.template_file
    assert cfn_lint_errors(template, synthesized.stack.region) == []
