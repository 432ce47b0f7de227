"""The spotgate CDK app: `cdk deploy`, run in this directory, stands spotgate up in AWS."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks
from stacks.context import config_from_context
from stacks.pool_region import PoolRegionRoutesStack, PoolRegionStack
from stacks.spotgate_stack import SpotgateStack

STACK_NAME = "Spotgate"


def build_app(
    context: Mapping[str, Any] | None = None, outdir: str | None = None
) -> tuple[cdk.App, SpotgateStack]:
    """The app with its home stack (returned) and the AWS Solutions checks (cdk-nag) registered.

    With `regions`, a stack per other region of the pool too, and one for its routes back.
    """
    app = cdk.App(context=dict(context) if context is not None else None, outdir=outdir)
    config = config_from_context(app.node)
    pool_regions = [
        PoolRegionStack(
            app,
            f"{STACK_NAME}-{pool_region.region}",
            config=config,
            pool_region=pool_region,
            token_issuer=config.gateway_url(config.gateway_domain),
            description=f"spotgate: the pool's GPU agents in {pool_region.region}",
        )
        for pool_region in config.pool_regions
    ]
    stack = SpotgateStack(
        app,
        STACK_NAME,
        config=config,
        pool_regions=pool_regions,
        description="spotgate: LLM serving on EC2 spot GPUs behind an edge gateway",
    )
    for remote, peering in zip(pool_regions, stack.peerings, strict=True):
        PoolRegionRoutesStack(
            app,
            f"{remote.stack_name}-routes",
            config=config,
            remote=remote,
            peering=peering,
            description=f"spotgate: {remote.pool_region.region}'s routes to the home VPC",
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
