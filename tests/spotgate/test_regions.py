from __future__ import annotations

import pytest

from spotgate.regions import zone_region


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
