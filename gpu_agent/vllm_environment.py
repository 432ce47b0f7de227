"""What vLLM reads from the environment, not its arguments: set before an engine starts."""

from __future__ import annotations

import os
from pathlib import Path

from spotgate.model_store import is_s3_uri
from spotgate.settings import AgentSettings, model_store_aws

CPU_KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
CPU_KV_CACHE_GIB_DEFAULT = "1"
"""vLLM's CPU backend sizes its KV cache from `CPU_KV_CACHE_ENV`; enough for the tiny model."""
CPU_ENGINE_PROCESSES_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
"""vLLM's variable: "0" runs a CPU engine's model in its engine core's process rather than in a
worker process beside it (an agent's default on a CPU)."""


def set_engine_environment(
    settings: AgentSettings, *, cpu: bool, kv_cache_bytes: int | None
) -> None:
    """Set what an engine's start reads from the environment.

    `cpu`: vLLM's CPU build; `kv_cache_bytes`: the engine arguments' KV cache size, if any.
    """
    if cpu:
        if kv_cache_bytes is None:  # the backend's variable outranks the flag
            os.environ.setdefault(CPU_KV_CACHE_ENV, CPU_KV_CACHE_GIB_DEFAULT)
        # With a worker process, the CPU backend pins the model's threads to one core (the
        # same core for every engine on the machine) and the two processes spin on their
        # shared-memory queue while the other works: two cores busy for one core's work, and
        # an engine starting imports vLLM twice. An operator's own setting stands.
        os.environ.setdefault(CPU_ENGINE_PROCESSES_ENV, "0")
    if is_s3_uri(settings.model):  # staged, `model_fetch: stream`
        os.environ.update(streamer_environment(settings))


def streamer_environment(settings: AgentSettings) -> dict[str, str]:
    """What the Run:ai streamer (vLLM's `runai_streamer` loader) reads its S3 access from.

    Its native client and the boto3 calls around it read only the environment; an endpoint
    of our own (the emulator) needs path-style addressing. vLLM's pulled config and
    tokenizer files go under the agent's model cache.
    """
    aws = model_store_aws(settings)
    env = {
        "AWS_DEFAULT_REGION": aws.region,
        "VLLM_ASSETS_CACHE": str(Path(settings.model_cache_dir).expanduser() / "vllm"),
    }
    if aws.endpoint_url:
        env["AWS_ENDPOINT_URL"] = aws.endpoint_url
        env["RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING"] = "0"
    if aws.access_key_id and aws.secret_access_key:
        env["AWS_ACCESS_KEY_ID"] = aws.access_key_id
        env["AWS_SECRET_ACCESS_KEY"] = aws.secret_access_key.get_secret_value()
    return env
