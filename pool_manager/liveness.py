"""Whether an agent of the pool is dead or done draining: the reaper's and the warm pool's test."""

from __future__ import annotations

from pool_manager.pool_view import (
    PolicySettings,
    PoolAgent,
)


def dead_reason(agent: PoolAgent, now: float, settings: PolicySettings) -> str | None:
    """Why the agent is dead (never came up, or its heartbeat stopped); None while it lives."""
    if agent.heartbeat_at is None:
        if agent.warm_boot:
            if now - agent.launched_at > settings.warm_start_timeout_seconds:
                return "not ready within the warm start timeout"
        elif now - agent.launched_at > settings.launch_timeout_seconds:
            return "not ready within the launch timeout"
    elif now - agent.heartbeat_at > settings.heartbeat_timeout_seconds:
        return "heartbeat stopped"
    return None


def is_drained(agent: PoolAgent, now: float) -> bool:
    """A draining agent that said its streams are done, or whose drain deadline has passed."""
    deadline = agent.drain_deadline
    done = agent.active_streams == 0 and agent.streams_known_since_drain
    return agent.phase == "draining" and (done or (deadline is not None and now >= deadline))
