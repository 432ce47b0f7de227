"""The spotgate CDK app: `cdk deploy`, run in this directory, stands spotgate up in AWS."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks
from stacks.context import config_from_context
from stacks.spotgate_stack import SpotgateStack

STACK_NAME = "Spotgate"


def build_app(
    context: Mapping[str, Any] | None = None, outdir: str | None = None
) -> tuple[cdk.App, SpotgateStack]:
    """The app with its one stack and the AWS Solutions checks (cdk-nag) registered."""
    app = cdk.App(context=dict(context) if context is not None else None, outdir=outdir)
    config = config_from_context(app.node)
    stack = SpotgateStack(
        app,
        STACK_NAME,
        config=config,
        description="spotgate: LLM serving on EC2 spot GPUs behind an edge gateway",
    )
    cdk.Tags.of(app).add("project", "spotgate")
    # Synthesis fails on any finding that is not acknowledged with a reason.
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app, stack


def main() -> None:
    """Synthesize the app (what `cdk synth` and `cdk deploy` run)."""
    app, _stack = build_app()
    app.synth()


if __name__ == "__main__":
    main()
