"""The warm pool end to end: an instance boots, is stopped, starts again, and boots warm.

On EC2 through the emulator (moto: real aioboto3 calls; the test plays the agent, which
registers under the instance's ARN as it would), and with real agent processes on this machine
(the local provider). The policy here is scripted: these tests are about carrying out its
warm-pool actions, not about when it asks for them.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from pool_manager.cold_starts import ColdStarts, TimedBoot
from pool_manager.controller import PoolController
from pool_manager.ec2_provider import Ec2Provider
from pool_manager.local_provider import INSTANCES_DIR, LocalProvider
from pool_manager.pool_view import Launch, PlacementOption, PolicySettings, StartWarm, StopToWarm
from pool_manager.service import policy_settings
from spotgate.registry import AgentRecord, AgentState, BootTimeline, PoolForecast, Registry
from spotgate.settings import AgentSettings, LocalPoolSettings, PoolSettings, settings_env
from stack.emulator import AwsEmulator
from tests.cli.test_cli import run
from tests.pool_manager.test_controller import Scripted
from tests.pool_manager.test_ec2_provider import GPU_TYPE, ZONE_A, Network, network, pool_settings
from tests.support.agents import wait_for
from tests.support.clocks import FakeClock

__all__ = ["network"]  # the emulator's VPC and launch template, a fixture

MODEL = "llama"
PLACEMENT = PlacementOption(GPU_TYPE, ZONE_A, 0.4, 1.0)
COLD_BOOT_SECONDS = 240.0  # launch to ready, as the test's agent reports it
WARM_BOOT_SECONDS = 40.0  # start to ready


def booted(record: AgentRecord, started_at: float, seconds: float) -> AgentRecord:
    """An agent's entry as it registers `seconds` after its instance started."""
    timeline = BootTimeline(
        instance_start=started_at,
        agent_start=started_at + seconds / 4,
        engine_loaded=started_at + seconds - 2,
        warmed_up=started_at + seconds - 1,
    )
    return replace(record, boot=timeline)


async def test_on_ec2_an_instance_stopped_into_the_warm_pool_boots_warm_when_started(
    aws: AwsEmulator, network: Network, registry: Registry, clock: FakeClock
) -> None:
    shared = aws.settings()
    policy = Scripted()
    cold_starts = ColdStarts(default_seconds=600.0)
    async with Ec2Provider.open(shared, pool_settings(network, shared), clock=clock) as provider:
        controller = PoolController(
            registry=registry,
            provider=provider,
            settings=PolicySettings(placements=(PLACEMENT,), heartbeat_timeout_seconds=3600),
            models=(MODEL,),
            policy=policy,
            clock=clock,
        )

        async def boots(seconds: float) -> AgentRecord:
            """The instance's agent registers, `seconds` after its boot began."""
            (instance,) = await provider.instances()
            clock.advance(seconds)
            agent = AgentRecord(
                agent_id=instance.agent_id, url="http://10.20.0.9:8000", model=MODEL,
                state=AgentState.READY, capacity=64, lifecycle="on-demand",
                instance_type=GPU_TYPE, zone=ZONE_A,
            )  # fmt: skip
            return await registry.register(booted(agent, instance.launched_at, seconds))

        async def reconciled() -> list[TimedBoot]:
            report = await controller.reconcile()
            return cold_starts.observe(report.agents, report.warm_started)

        # launch -> ready
        policy.rounds = [[Launch(GPU_TYPE, ZONE_A, "on-demand")]]
        await reconciled()
        (launched,) = await provider.instances()
        clock.now = launched.launched_at  # the emulator stamps `LaunchTime` with its own clock
        first = await boots(COLD_BOOT_SECONDS)
        (cold,) = await reconciled()
        assert (cold.kind, cold.placement) == ("cold", PLACEMENT.key)
        assert cold.seconds == COLD_BOOT_SECONDS

        # -> stop: its volume kept, its agent gone
        policy.rounds = [[StopToWarm(first.agent_id, "idle")]]
        await reconciled()
        assert await provider.instances() == []
        (stopped,) = await provider.stopped()
        assert stopped.agent_id == first.agent_id
        gone = await registry.get_agent(first.agent_id)
        assert gone is not None
        assert gone.state is AgentState.GONE

        # -> start: the same instance, its agent's id too, booting warm; gateways hear when
        clock.advance(3600)
        policy.rounds = [[StartWarm(stopped.instance_id, "a request for a model at zero")]]
        report = await controller.reconcile()
        assert report.warm_started == {first.agent_id}
        forecast = cold_starts.forecasts(report.agents, [MODEL], clock(), report.warm_started)
        # no warm start timed yet: expected within a cold start's time
        assert forecast == {MODEL: PoolForecast(clock() + cold.seconds, cold.seconds)}

        # -> ready: the second boot registers afresh, and is recorded as a warm start
        second = await boots(WARM_BOOT_SECONDS)
        assert second.agent_id == first.agent_id
        assert await reconciled() == [TimedBoot("warm", PLACEMENT.key, WARM_BOOT_SECONDS)]
        record = await registry.get_agent(first.agent_id)
        assert record is not None
        assert (record.state, record.boot_kind) == (AgentState.READY, "warm")
        assert cold_starts.estimate_seconds(PLACEMENT.key, "warm") == WARM_BOOT_SECONDS

    on_the_emulator = {**os.environ, **settings_env(aws.settings())}
    listed = run("pool", "boots", "--json", env=on_the_emulator)
    assert listed.returncode == 0, listed.stderr
    (boot,) = json.loads(listed.stdout)
    assert (boot["agent_id"], boot["kind"]) == (first.agent_id, "warm")
    assert boot["warm_start_seconds"] == boot["phases_seconds"]["ready"] == WARM_BOOT_SECONDS
    assert "cold_start_seconds" not in boot  # a reader of cold starts never takes it for one
    table = run("pool", "boots", env=on_the_emulator).stdout.splitlines()
    assert table[0].split()[:2] == ["AGENT", "KIND"]
    assert table[1].split()[:2] == [first.agent_id, "warm"]


async def test_a_local_instance_stopped_and_started_again_serves_warm_on_its_own_port(
    aws: AwsEmulator, tmp_path: Path
) -> None:
    agent = AgentSettings(heartbeat_seconds=1, imds_poll_seconds=0.5)
    settings = PoolSettings(
        shared=aws.settings(),
        provider="local",
        models=("synthetic",),
        local=LocalPoolSettings(
            engine="synthetic",
            jwks_url="http://127.0.0.1:9/.well-known/jwks.json",  # no token is checked here
            drain_grace_seconds=5.0,
            log_dir=str(tmp_path),
            agent_env=settings_env(agent),
        ),
    )
    provider = LocalProvider(settings.shared, settings.local, settings.models)
    policy = Scripted()
    try:
        async with Registry.open(aws.settings()) as registry:
            await registry.create_tables()
            controller = PoolController(
                registry=registry,
                provider=provider,
                settings=policy_settings(settings),
                models=("synthetic",),
                policy=policy,
            )

            async def ready() -> bool:
                record = await registry.get_agent("local-1")
                return record is not None and record.state is AgentState.READY

            placement = policy_settings(settings).placements[0]
            policy.rounds = [[Launch(placement.instance_type, placement.zone, "on-demand")]]
            await controller.reconcile()
            await wait_for(ready, within=60)
            (first,) = await provider.instances()
            volume = tmp_path / INSTANCES_DIR / "local-1"
            assert volume.is_dir()

            policy.rounds = [[StopToWarm("local-1", "idle")]]
            await controller.reconcile()
            assert await provider.instances() == []
            assert [s.agent_id for s in await provider.stopped()] == ["local-1"]

            async def stopped() -> bool:  # stopping until its agent has exited
                return not (await provider.stopped())[0].stopping

            await wait_for(stopped, within=60)
            policy.rounds = [[StartWarm("local-1", "cover")]]
            assert (await controller.reconcile()).warm_started  # stopped: it starts at once
            await wait_for(ready, within=60)
            (second,) = await provider.instances()
            assert (second.url, second.boot) == (first.url, "warm")  # its address kept
            assert volume.is_dir()
            assert (tmp_path / "agent-local-1.2.log").exists()  # a new agent: its own log
            await controller.reconcile()
            record = await registry.get_agent("local-1")
            assert record is not None
            assert record.boot_kind == "warm"
            # its start, as its IMDS says (to the second, as EC2's `pendingTime`)
            assert record.boot.instance_start == pytest.approx(second.launched_at, abs=1.0)
    finally:
        await provider.close()
