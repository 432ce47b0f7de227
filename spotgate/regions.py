"""Regions and their availability zones: a zone's name starts with its region's."""

from __future__ import annotations

import re

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
