"""Which engine an agent runs: the engine modules import `engine`, this imports them."""

from __future__ import annotations

import asyncio

from gpu_agent.engine import Engine
from spotgate.settings import AgentSettings


async def load_engine(settings: AgentSettings) -> Engine:
    """Build the engine the settings ask for; vLLM is imported only when asked for."""
    if settings.engine == "synthetic":
        from gpu_agent.synthetic_engine import SyntheticEngine

        await asyncio.sleep(settings.synthetic.load_seconds)  # its stand-in for a load
        return SyntheticEngine(settings)
    from gpu_agent.vllm_engine import VllmEngine

    return await VllmEngine.start(settings)
