"""Read a Prometheus exposition the way Prometheus does (`prometheus_client.parser`)."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families


async def scrape(url: str) -> str:
    """The exposition a service serves at `url` (its `/metrics`)."""
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        assert response.status == 200
        return await response.text()


def metric_value(exposition: str, sample: str, **labels: str) -> float:
    """The value of the one sample named `sample` with exactly these labels."""
    found = [
        each.value
        for family in text_string_to_metric_families(exposition)
        for each in family.samples
        if each.name == sample and each.labels == labels
    ]
    assert len(found) == 1, f"{sample}{labels}: {len(found)} samples"
    return float(found[0])
