"""vLLM's engine arguments for an agent: its settings, then any `vllm serve` flag besides.

The arguments an agent sets itself (`VllmSettings`' fields, the model, its served name) are
settings of their own (`spotgate.engine_flags`); every other engine argument vLLM has is
passed as `vllm serve` takes it, in `SPOTGATE_AGENT_VLLM__ENGINE_ARGS` (`--quantization awq
--kv-cache-dtype fp8`), so a user's flags carry over. vLLM's own parser reads them all, so an
argument it does not know, or a value of the wrong type, stops the agent's start with one line
naming it, before any weight is loaded.
"""

from __future__ import annotations

import shlex
from typing import Any

from gpu_agent.engine import EngineConfigError
from spotgate.engine_flags import ENGINE_ARGS_ENV, own_flag_refusal
from spotgate.model_store import is_s3_uri
from spotgate.settings import AgentSettings


def agent_flags(settings: AgentSettings) -> list[str]:
    """The agent's own settings as `vllm serve` flags."""
    vllm = settings.vllm
    flags = [
        "--model", settings.model,
        "--served-model-name", settings.served_model_name or settings.model,
        "--dtype", vllm.dtype,
        "--max-num-seqs", str(vllm.max_num_seqs),
        "--gpu-memory-utilization", str(vllm.gpu_memory_utilization),
        "--tensor-parallel-size", str(vllm.tensor_parallel_size),
    ]  # fmt: skip
    if vllm.enforce_eager:
        flags.append("--enforce-eager")
    if vllm.max_model_len is not None:
        flags += ["--max-model-len", str(vllm.max_model_len)]
    if vllm.revision is not None:
        flags += ["--revision", vllm.revision, "--tokenizer-revision", vllm.revision]
    if is_s3_uri(settings.model):  # staged, `model_fetch: stream`
        flags += ["--load-format", "runai_streamer"]
    if vllm.lora_adapters:
        # One slot more than the agent ever fills (`gpu_agent.adapters`): vLLM's CPU kernels
        # give a request without an adapter the last slot's, when that slot holds one.
        slots = str(vllm.max_loras + 1)
        flags += ["--enable-lora", "--max-loras", slots, "--max-cpu-loras", slots,
                  "--max-lora-rank", str(vllm.max_lora_rank)]  # fmt: skip
    return flags


def user_flags(settings: AgentSettings) -> list[str]:
    """The further flags the settings give, split as a shell would; refused if the agent's own."""
    try:
        flags = shlex.split(settings.vllm.engine_args)
    except ValueError as err:
        raise EngineConfigError(f"{ENGINE_ARGS_ENV}: {err}") from err
    refusal = own_flag_refusal(flags)
    if refusal is not None:
        raise EngineConfigError(refusal)
    return flags


def engine_args(settings: AgentSettings) -> Any:
    """VLLM's `AsyncEngineArgs` for the agent, read by vLLM's own `vllm serve` parser.

    Raises `EngineConfigError` (one line, naming the argument) for an argument vLLM does not
    know or a value it does not take.
    """
    import argparse

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    given = user_flags(settings)
    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser(exit_on_error=False))
    try:
        parsed, unknown = parser.parse_known_args([*agent_flags(settings), *given])
    except argparse.ArgumentError as err:
        raise EngineConfigError(f"{ENGINE_ARGS_ENV}: {err}") from err
    if unknown:
        raise EngineConfigError(
            f"{ENGINE_ARGS_ENV}: {shlex.join(unknown)}: not an engine argument of vLLM's"
        )
    return AsyncEngineArgs.from_cli_args(parsed)
