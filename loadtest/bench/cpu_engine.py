"""vLLM's CPU engine as the benchmarks start it.

One engine configuration (`BenchEngine`) names every argument the engine starts with, so a
benchmark that compares the agent with `vllm serve` starts both the same way, and its report
says how. It imports nothing heavy: a benchmark that runs the engine in its own process must
not bring the AWS emulator's web framework in beside it (vLLM's CPU workers walk every loaded
module's globals at start).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu_agent.vllm_environment import CPU_ENGINE_PROCESSES_ENV, CPU_KV_CACHE_ENV
from spotgate.settings import VllmSettings


@dataclass(frozen=True, slots=True)
class BenchEngine:
    """The vLLM CPU engine's arguments (eager: no graph capture on the CPU)."""

    max_num_seqs: int
    dtype: str = "float32"
    max_model_len: int = 2048
    # On vLLM's CPU backend, the share of the NUMA node's memory each engine may take at
    # start: two engines side by side must both fit.
    memory_utilization: float = 0.3
    kv_cache_gib: str = "1"

    @property
    def label(self) -> str:
        """The arguments, as a report states them."""
        return (
            f"dtype {self.dtype}, max_model_len {self.max_model_len}, "
            f"max_num_seqs {self.max_num_seqs}, eager"
        )

    @property
    def env(self) -> dict[str, str]:
        """What the CPU backend reads from the environment: its KV cache, one process each.

        One process per engine is the agent's default on a CPU; `vllm serve` gets it alike.
        """
        return {CPU_KV_CACHE_ENV: self.kv_cache_gib, CPU_ENGINE_PROCESSES_ENV: "0"}

    def vllm_settings(self) -> VllmSettings:
        """The agent's engine settings."""
        return VllmSettings(
            dtype=self.dtype,
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            enforce_eager=True,
            gpu_memory_utilization=self.memory_utilization,
        )
