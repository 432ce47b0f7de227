"""The policy's view of one agent: its instance joined with its registry entry (pure)."""

from __future__ import annotations

from pool_manager.pool_view import AgentPhase, PoolAgent
from pool_manager.provider import Instance
from spotgate.registry import AgentRecord, AgentState

_PHASES: dict[AgentState, AgentPhase] = {
    AgentState.STARTING: "starting",
    AgentState.READY: "ready",
    AgentState.DRAINING: "draining",
    AgentState.GONE: "draining",
}


def pool_agent(instance: Instance, record: AgentRecord | None, now: float) -> PoolAgent:
    """The policy's view of one instance and its registry entry (None: still booting)."""
    if record is None:
        return PoolAgent(
            agent_id=instance.agent_id,
            lifecycle=instance.lifecycle,
            instance_type=instance.instance_type,
            zone=instance.zone,
            phase="starting",
            launched_at=instance.launched_at,
            for_warm_pool=instance.for_warm_pool,
            warm_boot=instance.boot == "warm",
        )
    gone = record.state is AgentState.GONE
    return PoolAgent(
        agent_id=instance.agent_id,
        lifecycle=instance.lifecycle,
        instance_type=instance.instance_type,
        zone=instance.zone,
        phase=_PHASES[record.state],
        launched_at=instance.launched_at,
        active_streams=0 if gone else record.active,
        streams_known_since_drain=gone or record.active_since_drain,
        heartbeat_at=record.heartbeat_at,
        drain_deadline=now if gone else record.drain_deadline,
        ready_at=record.ready_at,
        at_risk=record.rebalance_at is not None,
        for_warm_pool=instance.for_warm_pool,
        warm_boot=instance.boot == "warm",
    )
