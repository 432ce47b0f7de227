from __future__ import annotations

import botocore.session
import pytest

from spotgate.regions import EC2_REGIONS, unknown_regions, zone_region


@pytest.mark.parametrize(
    ("zone", "region"),
    [
        ("us-east-2b", "us-east-2"),
        ("eu-central-1c", "eu-central-1"),
        ("us-gov-west-1a", "us-gov-west-1"),
        ("us-west-2-lax-1a", "us-west-2"),  # a Local Zone is in its parent region
        ("local-a", "local"),  # the local provider's
        ("local", "local"),
    ],
)
def test_a_zones_region_is_the_start_of_its_name(zone: str, region: str) -> None:
    assert zone_region(zone) == region


def test_the_regions_known_are_those_botocore_serves_ec2_in() -> None:
    session = botocore.session.get_session()
    served = {
        region
        for partition in session.get_available_partitions()
        for region in session.get_available_regions("ec2", partition)
    }
    assert served == EC2_REGIONS


@pytest.mark.parametrize(
    ("regions", "unknown"),
    [
        (["us-east-1", "us-west-2"], []),
        (["us-west-9", "local", "eu-isoe-west-1", "us-east1"], ["us-west-9", "us-east1"]),
    ],
)
def test_unknown_regions_are_named(regions: list[str], unknown: list[str]) -> None:
    assert unknown_regions(regions) == unknown
