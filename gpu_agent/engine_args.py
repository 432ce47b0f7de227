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
from pathlib import Path
from typing import Any

from gpu_agent.engine import EngineConfigError
from spotgate.engine_flags import ENGINE_ARGS_ENV, own_flag_refusal
from spotgate.model_store import is_s3_uri
from spotgate.settings import AgentSettings
from spotgate.settings_env_names import env_name

CHAT_TEMPLATE_ENV = env_name(AgentSettings, "vllm.chat_template")
MODEL_ENV = env_name(AgentSettings, "model")
LOCAL_PATH_PREFIXES = ("/", "./", "../", "~")
"""How a model given as a path on this machine starts (anything else may be a Hub id)."""
JINJA_MARKUP = ("{{", "{%")
"""What tells a chat template's text from a file's name (as vLLM's `--chat-template` does)."""


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


def check_model_directory(model: str) -> None:
    """Refuse a model given as a path that holds no model, naming it.

    vLLM takes any other name for a Hugging Face id, and a missing directory would fail as
    one ("Repo id must be in the form 'repo_name'…").
    """
    if not model.startswith(LOCAL_PATH_PREFIXES):
        return
    directory = Path(model).expanduser()
    if not directory.is_dir():
        raise EngineConfigError(f"{MODEL_ENV}: {model}: no such directory")
    if not (directory / "config.json").is_file():
        raise EngineConfigError(f"{MODEL_ENV}: {model} holds no model (no config.json)")


def engine_args(settings: AgentSettings) -> Any:
    """VLLM's `AsyncEngineArgs` for the agent, read by vLLM's own `vllm serve` parser.

    Raises `EngineConfigError` (one line, naming the argument) for an argument vLLM does not
    know or a value it does not take.
    """
    import argparse

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    check_model_directory(settings.model)
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


def read_chat_template(value: str, model_dir: Path | None) -> str:
    """The chat template a setting names: its text, or a file's (relative: in `model_dir`).

    Raises `EngineConfigError` (one line) for a file it cannot read or a template Jinja cannot
    compile, so a bad one stops the start, not a request.
    """
    import jinja2.sandbox

    if any(markup in value for markup in JINJA_MARKUP):
        text = value
    else:
        path = Path(value).expanduser()
        if not path.is_absolute():
            if model_dir is None:
                raise EngineConfigError(
                    f"{CHAT_TEMPLATE_ENV}: {value}: a relative path is read in the model's "
                    "directory, and this model has none here; give an absolute path"
                )
            path = model_dir / path
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
            raise EngineConfigError(f"{CHAT_TEMPLATE_ENV}: cannot read {path}: {reason}") from err
    try:
        jinja2.sandbox.ImmutableSandboxedEnvironment().parse(text)
    except jinja2.TemplateSyntaxError as err:
        raise EngineConfigError(
            f"{CHAT_TEMPLATE_ENV}: not a Jinja template: {err.message} (line {err.lineno})"
        ) from err
    return text


def chat_template(
    settings: AgentSettings, model_dir: str, *, before_load: bool = False
) -> str | None:
    """The chat template the settings give (None: the model's own), read in `model_dir`.

    Read `before_load` too, so that a bad one stops the start before any weight loads, where
    the model's directory is here already (a staged or Hub model's is not: it waits for the
    tokenizer's directory).
    """
    value = settings.vllm.chat_template
    if value is None:
        return None
    directory: Path | None = Path(model_dir)
    if directory is not None and not directory.is_dir():
        if before_load:
            return None
        directory = None
    return read_chat_template(value, directory)
