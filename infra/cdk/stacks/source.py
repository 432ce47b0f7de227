"""What of this repository ships: the services' image and the GPU agents' image."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import IgnoreMode, Stack
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from constructs import Construct

from stacks.config import ECR_IMAGE, DeployConfig

REPO_ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = "infra/cdk/Dockerfile"
"""Relative to the repository root, which is the image's build context."""
AGENT_DOCKERFILE = "infra/cdk/agent.Dockerfile"
"""The GPU agents' image, from the same context."""

PACKAGES = ("spotgate", "gateway", "gpu_agent", "pool_manager", "stack", "cli")
"""What the `spotgate` command (`cli`) runs the services with; `loadtest` stays behind."""
LOCKS = "requirements"
"""The hash-pinned locks the images install: agent-gpu.lock (agents), service.lock (services)."""
_PACKAGE_FILES = ("pyproject.toml", "README.md", LOCKS, *PACKAGES)

# Docker-style patterns: leave everything out, then take back what `pip install .` needs, so
# virtualenvs, caches, test output and cdk.out never reach an asset (or its hash).
SOURCE_PATTERNS: tuple[str, ...] = (
    "*",
    *(f"!{name}" for name in _PACKAGE_FILES),
    "**/__pycache__",
    "**/*.pyc",
    # The chat page's libraries as fetched here: the image fetches and checks its own.
    "gateway/static/vendor",
)
IMAGE_PATTERNS: tuple[str, ...] = (*SOURCE_PATTERNS, f"!{DOCKERFILE}")
AGENT_IMAGE_PATTERNS: tuple[str, ...] = (*SOURCE_PATTERNS, f"!{AGENT_DOCKERFILE}")


def service_image(config: DeployConfig) -> ecs.ContainerImage:
    """The gateway's and pool manager's image: `containerImage` if set, else built here."""
    if config.container_image:
        return ecs.ContainerImage.from_registry(config.container_image)
    return ecs.ContainerImage.from_asset(
        str(REPO_ROOT),
        file=DOCKERFILE,
        exclude=list(IMAGE_PATTERNS),
        ignore_mode=IgnoreMode.DOCKER,
    )


def agent_image(
    scope: Construct, construct_id: str, config: DeployConfig
) -> tuple[str, ecr.IRepository]:
    """The GPU agents' image URI and repository: `agentImage`, else built by `cdk deploy`.

    A built one is pushed to the CDK's ECR repository; `agentImage` is one built elsewhere.
    """
    prebuilt = ECR_IMAGE.fullmatch(config.agent_image)
    if prebuilt is not None:
        arn = Stack.of(scope).format_arn(
            service="ecr",
            account=prebuilt["account"],
            region=prebuilt["region"],
            resource="repository",
            resource_name=prebuilt["repository"],
        )
        repository = ecr.Repository.from_repository_attributes(
            scope, construct_id, repository_arn=arn, repository_name=prebuilt["repository"]
        )
        return config.agent_image, repository
    asset = ecr_assets.DockerImageAsset(
        scope,
        construct_id,
        directory=str(REPO_ROOT),
        file=AGENT_DOCKERFILE,
        exclude=list(AGENT_IMAGE_PATTERNS),
        ignore_mode=IgnoreMode.DOCKER,
        platform=ecr_assets.Platform.LINUX_AMD64,
    )
    return asset.image_uri, asset.repository
