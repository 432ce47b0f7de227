"""Regions and their availability zones: a zone's name starts with its region's."""

from __future__ import annotations

import re
from collections.abc import Iterable

_AWS_REGION = re.compile(r"[a-z]{2}(?:-gov|-iso[a-z]?)?-[a-z]+-\d+")
"""An AWS region at the start of a zone's name: us-east-2 of us-east-2b and of the Local
Zone us-east-2-chi-1a."""
_ZONE_LETTER = re.compile(r"-[a-z]$")
"""The local provider's zones: local-a is local's zone a."""


def zone_region(zone: str) -> str:
    """The region an availability zone is in (a name that is no zone's: itself)."""
    if (region := _AWS_REGION.match(zone)) is not None:
        return region.group(0)
    return _ZONE_LETTER.sub("", zone)


LOCAL_REGION = "local"
"""The local provider's one region (its zones local-a, local-b)."""


EC2_REGIONS = frozenset(
    {
        "af-south-1", "ap-east-1", "ap-east-2", "ap-northeast-1", "ap-northeast-2",
        "ap-northeast-3", "ap-south-1", "ap-south-2", "ap-southeast-1", "ap-southeast-2",
        "ap-southeast-3", "ap-southeast-4", "ap-southeast-5", "ap-southeast-6", "ap-southeast-7",
        "ca-central-1", "ca-west-1", "eu-central-1", "eu-central-2", "eu-north-1", "eu-south-1",
        "eu-south-2", "eu-west-1", "eu-west-2", "eu-west-3", "il-central-1", "me-central-1",
        "me-south-1", "mx-central-1", "sa-east-1", "us-east-1", "us-east-2", "us-west-1",
        "us-west-2",
        "cn-north-1", "cn-northwest-1",
        "us-gov-east-1", "us-gov-west-1",
        "us-iso-east-1", "us-iso-west-1", "us-isob-east-1", "us-isob-west-1", "eu-isoe-west-1",
        "us-isof-east-1", "us-isof-south-1",
    }
)  # fmt: skip
"""Every region EC2 serves, in every partition (botocore's endpoints, which a test compares)."""


def unknown_regions(regions: Iterable[str]) -> list[str]:
    """Those of `regions` that are no EC2 region (nor the local provider's)."""
    return [r for r in regions if r != LOCAL_REGION and r not in EC2_REGIONS]
