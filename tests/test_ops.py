"""The operator's dashboard and scrape configuration name what the services really export."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from gateway.metrics import GatewayMetrics
from gpu_agent.metrics import AgentMetrics
from pool_manager.metrics import PoolMetrics
from spotgate.settings import AgentSettings, GatewaySettings, PoolSettings

OPS = Path(__file__).resolve().parents[1] / "ops"
SERIES_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "gauge": ("",),
}


def exported(registry: CollectorRegistry) -> set[str]:
    """Every series name a registry can expose, labelled or not, used or not."""
    return {
        family.name + suffix
        for family in registry.collect()
        for suffix in SERIES_SUFFIXES[family.type]
    }


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((OPS / "grafana" / "spotgate.json").read_text())
    return loaded


def test_every_panel_queries_metrics_the_services_export() -> None:
    series = (
        exported(GatewayMetrics().registry)
        | exported(AgentMetrics().registry)
        | exported(PoolMetrics().registry)
    )
    panels = dashboard()["panels"]
    assert panels
    for panel in panels:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            named = set(re.findall(r"spotgate_[a-z_]+", target["expr"]))
            assert named, (panel["title"], target["expr"])
            assert named <= series, (panel["title"], named - series)


def test_the_dashboard_shows_what_an_operator_of_the_pool_asks() -> None:
    titles = " ".join(panel["title"].lower() for panel in dashboard()["panels"])
    for topic in ("streams", "first token", "queue", "tokens per second", "agents by state",
                  "interruptions", "resumed", "wedged", "cold start", "cost", "warm",
                  "before the break", "per model", "launches held", "per region"):  # fmt: skip
        assert topic in titles, topic


def test_the_scrape_configuration_uses_the_services_ports() -> None:
    config = yaml.safe_load((OPS / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    local = jobs["spotgate-local"]["static_configs"][0]["targets"]
    gateway_ops = f"127.0.0.1:{GatewaySettings().ops_port}"
    assert local == [gateway_ops, f"127.0.0.1:{PoolSettings().port}"]
    (agents,) = jobs["spotgate-agents"]["ec2_sd_configs"]
    assert agents["port"] == AgentSettings().port
