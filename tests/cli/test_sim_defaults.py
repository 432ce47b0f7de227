"""`spotgate sim`, the simulator and the pool manager take the pool's defaults from one place."""

from __future__ import annotations

from dataclasses import fields

from cli.main import build_parser
from pool_manager.pool_view import PolicySettings
from pool_manager.service import policy_settings
from pool_manager.sim.config import SimConfig, settings_for
from spotgate.settings import POOL_DEFAULTS, PoolSettings

SIM_OPTIONS = {
    "warm_pool": "warm_pool_size",
    "overprovision": "spot_overprovision",
    "on_demand_hold": "on_demand_hold_seconds",
    "volume_gib": "volume_gib",
    "volume_price": "volume_dollars_per_gib_month",
}
"""`spotgate sim` options that set a pool setting, and the simulator's name for it."""
SIM_CONFIG = {
    "warm_pool_size": "warm_pool_size",
    "spot_overprovision": "spot_overprovision",
    "on_demand_hold_seconds": "on_demand_hold_seconds",
    "risky_placement_seconds": "risky_placement_seconds",
    "streams_per_agent": "target_streams_per_agent",
    "on_demand_margin": "on_demand_margin",
    "on_demand_margin_spot_age_seconds": "on_demand_margin_spot_age_seconds",
    "on_demand_margin_shortage_seconds": "on_demand_margin_shortage_seconds",
    "volume_gib": "volume_gib",
    "volume_dollars_per_gib_month": "volume_price_per_gib_month",
}
"""The simulator's settings that are the pool's, and the pool setting each is."""


def test_the_pool_manager_runs_the_policy_with_the_pool_defaults() -> None:
    live = policy_settings(PoolSettings(provider="ec2"))
    assert live == PolicySettings(placements=())
    assert live.scale_down_idle_seconds == POOL_DEFAULTS.scale_to_zero_idle_seconds
    assert live.heartbeat_timeout_seconds == POOL_DEFAULTS.shared.registry.agent_ttl_seconds


def test_the_simulator_takes_the_pool_defaults() -> None:
    config = SimConfig()
    for name, pool_name in SIM_CONFIG.items():
        assert getattr(config, name) == getattr(POOL_DEFAULTS, pool_name), name
    simulated = settings_for(config, config.target, ())
    unset = {"min_agents", "max_agents"}  # the simulator holds each model at its target
    for field in fields(PolicySettings):
        if field.name not in unset:
            assert getattr(simulated, field.name) == field.default or field.name == "placements"


def test_spotgate_sim_defaults_are_the_simulators() -> None:
    args = build_parser().parse_args(["sim", "--traces", "traces"])
    for option, name in SIM_OPTIONS.items():
        assert getattr(args, option) == getattr(SimConfig(), name), option
