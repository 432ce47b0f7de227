"""`spotgate up` (the whole system locally) and the services run from the environment."""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from cli.args import CommandError, Commands, positive_int, region_list
from spotgate.logging import configure_logging
from spotgate.regions import unknown_regions
from spotgate.settings import GatewaySettings
from stack.builder import StackFailed
from stack.local import UpModel, UpOptions, run_up

SERVING_FLAGS = {
    "--tool-call-parser": ("tool_call_parser", "vLLM's tool-call parser (hermes, llama3_json, …)"),
    "--reasoning-parser": ("reasoning_parser", "vLLM's reasoning parser (qwen3, deepseek_r1, …)"),
    "--chat-template": ("chat_template", "a Jinja chat template file, in place of the model's"),
    "--engine-args": ("engine_args", "more engine arguments, as `vllm serve` takes them"),
}
"""A model's serving flags, each for the `--model` before it: its setting, and its help."""
FOUND_IN_FILES = ("tool_call_parser", "reasoning_parser")
NONE = "none"


class _ModelAction(argparse.Action):
    """`--model DIR`: one more model, which the serving flags after it are for."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
        values: str | Sequence[Any] | None, option_string: str | None = None,
    ) -> None:  # fmt: skip
        setattr(namespace, self.dest, [*getattr(namespace, self.dest), UpModel(Path(str(values)))])


class _ServingAction(argparse.Action):
    """A serving flag (`--tool-call-parser NAME`, …): set for the `--model` before it."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
        values: str | Sequence[Any] | None, option_string: str | None = None,
    ) -> None:  # fmt: skip
        models: list[UpModel] = list(namespace.model)
        if not models:
            parser.error(f"{option_string}: give it after the --model it is for")
        value: str | None = str(values)
        if self.dest in FOUND_IN_FILES and value == NONE:
            value = None  # none at all, not the one its files name
        elif self.dest == "chat_template":
            value = str(Path(str(values)).resolve())  # the agent reads it in another directory
        last = models[-1]
        models[-1] = replace(last, serving=last.serving.model_copy(update={self.dest: value}))
        namespace.model = models


def _up(args: argparse.Namespace) -> int:
    if args.engine == "synthetic" and any(model.serving.model_fields_set for model in args.model):
        raise CommandError(f"{', '.join(SERVING_FLAGS)}: for --engine vllm's models only")
    options = UpOptions(
        port=args.port,
        agents=args.agents,
        engine=args.engine,
        models=tuple(args.model),
        gateways=args.gateways,
        ops_port=args.ops_port,
        regions=args.regions,
        fresh=args.fresh,
    )
    if unknown := unknown_regions(options.regions):
        raise CommandError(f"--regions: no EC2 region is called {', '.join(unknown)}")
    configure_logging("warning")  # what `up` says of its children (a restart), on stderr
    # Started where SIGINT is ignored (`cmd &` in a script, CI runners), Python leaves it
    # ignored and asyncio then takes no Ctrl-C: `kill -INT` would not stop the stack.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return asyncio.run(
            run_up(Path.cwd(), options, announce=lambda line: print(line, flush=True))
        )
    except StackFailed as err:  # what `up` says of a part that did not come up
        raise CommandError(str(err)) from err


def _agent(_args: argparse.Namespace) -> int:
    from gpu_agent.service import main

    return main()


def _gateway(_args: argparse.Namespace) -> int:
    from gateway.service import main

    return main()


def setup_services(commands: Commands) -> None:
    """Add `up`, `gateway` and `agent`."""
    up = commands.add_parser("up", help="run the whole system locally")
    up.add_argument(
        "--port", type=int, default=8080, help="gateway port (default 8080; 0: any free port)"
    )
    up.add_argument(
        "--ops-port",
        type=int,
        help="the gateway's /readyz and /metrics port (default "
        f"{GatewaySettings.model_fields['ops_port'].default}, or any free one with --port 0; "
        "0: any free port)",
    )
    up.add_argument("--agents", type=positive_int, default=1, help="GPU agents to start")
    up.add_argument(
        "--gateways",
        type=positive_int,
        default=1,
        help="gateway replicas, on consecutive ports from --port (default 1)",
    )
    up.add_argument("--engine", choices=["vllm", "synthetic"], default="vllm")
    up.add_argument(
        "--model",
        action=_ModelAction,
        default=[],
        help="a model directory, served under its name by --agents agents of its own; "
        "repeat it for several models (default: the tiny model; with --engine synthetic, names)."
        " The serving flags after it are its own; parsers not given are the ones its files "
        "name (`spotgate model inspect DIR`)",
    )
    for flag, (setting, text) in SERVING_FLAGS.items():
        extra = f"; {NONE}: none" if setting in FOUND_IN_FILES else ""
        up.add_argument(flag, dest=setting, action=_ServingAction, help=f"{text}{extra}")
    up.add_argument(
        "--regions",
        type=region_list,
        default=(),
        help="run the pool's agents in these regions, comma-separated, two zones each (the "
        "gateways and the registry stay in the emulator's us-east-1); default: two local zones",
    )
    up.add_argument(
        "--fresh",
        action="store_true",
        help="start with no API keys, usage, files or batches: forget what earlier runs in "
        "this directory kept (.spotgate/aws-journal)",
    )
    up.set_defaults(handler=_up)

    gateway = commands.add_parser("gateway", help="run the gateway from the environment")
    gateway.set_defaults(handler=_gateway)
    agent = commands.add_parser("agent", help="run a GPU agent from the environment")
    agent.set_defaults(handler=_agent)
