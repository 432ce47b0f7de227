"""The `vllm serve` flags an agent sets itself, which its engine arguments may not repeat.

The agent's own engine arguments (`VllmSettings`' fields, the model, its served name) are
settings of their own; every other flag vLLM takes is passed in `engine_args`. The agent
refuses one of its own there at its start, and the CDK app before anything launches.
"""

from __future__ import annotations

from spotgate.settings import AgentSettings
from spotgate.settings_env_names import env_name

ENGINE_ARGS_ENV = env_name(AgentSettings, "vllm.engine_args")
_MODEL_ENV = env_name(AgentSettings, "model")
_LORA_ADAPTERS_ENV = env_name(AgentSettings, "vllm.lora_adapters")
_MAX_LORAS_ENV = env_name(AgentSettings, "vllm.max_loras")
_REVISION_ENV = env_name(AgentSettings, "vllm.revision")
_TENSOR_PARALLEL_ENV = env_name(AgentSettings, "vllm.tensor_parallel_size")
OWN_FLAGS = {
    "--model": _MODEL_ENV,
    "--served-model-name": env_name(AgentSettings, "served_model_name"),
    "--dtype": env_name(AgentSettings, "vllm.dtype"),
    "--max-model-len": env_name(AgentSettings, "vllm.max_model_len"),
    "--max-num-seqs": env_name(AgentSettings, "vllm.max_num_seqs"),
    "--gpu-memory-utilization": env_name(AgentSettings, "vllm.gpu_memory_utilization"),
    "--tensor-parallel-size": _TENSOR_PARALLEL_ENV,
    "-tp": _TENSOR_PARALLEL_ENV,
    "--enforce-eager": env_name(AgentSettings, "vllm.enforce_eager"),
    "--revision": _REVISION_ENV,
    "--tokenizer-revision": _REVISION_ENV,
    "--load-format": f"{_MODEL_ENV} (an s3:// model is streamed)",
    "--logits-processors": "the agent's own (exact resumes, JSON schemas)",
    "--disable-log-stats": "the agent's own (it reads the prefix cache's counters)",
    "--enable-lora": _LORA_ADAPTERS_ENV,
    "--lora-modules": _LORA_ADAPTERS_ENV,
    "--max-loras": _MAX_LORAS_ENV,
    "--max-cpu-loras": _MAX_LORAS_ENV,
    "--max-lora-rank": env_name(AgentSettings, "vllm.max_lora_rank"),
    # `vllm serve`'s own, not the engine's: the agent reads these for each model.
    "--chat-template": env_name(AgentSettings, "vllm.chat_template"),
    "--tool-call-parser": env_name(AgentSettings, "vllm.tool_call_parser"),
    "--reasoning-parser": env_name(AgentSettings, "vllm.reasoning_parser"),
}
"""Flags the agent sets itself, and the setting that sets each instead."""


def own_flag_refusal(flags: list[str]) -> str | None:
    """The first of `flags` the agent sets itself, as one line naming its setting."""
    for flag in flags:
        name = flag.split("=", 1)[0]
        if name in OWN_FLAGS:
            return f"{ENGINE_ARGS_ENV}: {name} is set by {OWN_FLAGS[name]}, not here"
    return None
