"""What of this repository ships: the service image and the agents' source bundle."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import IgnoreMode
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from stacks.config import DeployConfig

REPO_ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = "infra/cdk/Dockerfile"
"""Relative to the repository root, which is the image's build context."""

PACKAGES = ("spotgate", "gateway", "gpu_agent", "pool_manager", "stack", "cli")
"""What the `spotgate` command (`cli`) runs the services with; `loadtest` stays behind."""
LOCKS = "requirements"
"""The hash-pinned locks the agents (agent-gpu.lock) and the image (service.lock) install."""
_PACKAGE_FILES = ("pyproject.toml", "README.md", LOCKS, *PACKAGES)

# Docker-style patterns: leave everything out, then take back what `pip install .` needs, so
# virtualenvs, caches, test output and cdk.out never reach an asset (or its hash).
SOURCE_PATTERNS: tuple[str, ...] = (
    "*",
    *(f"!{name}" for name in _PACKAGE_FILES),
    "**/__pycache__",
    "**/*.pyc",
)
IMAGE_PATTERNS: tuple[str, ...] = (*SOURCE_PATTERNS, f"!{DOCKERFILE}")


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


def agent_source(scope: Construct, construct_id: str) -> s3_assets.Asset:
    """The repository's Python packages as a zip the agents `pip install` at boot."""
    return s3_assets.Asset(
        scope,
        construct_id,
        path=str(REPO_ROOT),
        exclude=list(SOURCE_PATTERNS),
        ignore_mode=IgnoreMode.DOCKER,
    )
