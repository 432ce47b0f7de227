"""`spotgate env`: the local stack's address and dev key as shell variables.

`eval "$(spotgate env)"` in a shell run from the directory of `spotgate up` sets what the
docs' examples use: `SPOTGATE_URL`, `SPOTGATE_KEY` and `SPOTGATE_MODEL` (the model the agents
serve), and the same as `OPENAI_BASE_URL` and `OPENAI_API_KEY`, which the openai SDK (and
LangChain, LiteLLM, most OpenAI clients) read.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from cli.args import CommandError, Commands
from stack.local import UP_FILE, LocalStackInfo, find_local_stack


def shell_exports(stack: LocalStackInfo) -> list[str]:
    """`export NAME=value` lines for the stack's first gateway, its dev key and its model."""
    if stack.gateway_url is None or stack.model is None:
        raise CommandError("the local stack has no gateway or no model")
    variables = {
        "SPOTGATE_URL": stack.gateway_url,
        "SPOTGATE_KEY": stack.api_key,
        "SPOTGATE_MODEL": stack.model,
        "OPENAI_BASE_URL": f"{stack.gateway_url}/v1",
        "OPENAI_API_KEY": stack.api_key,
    }
    return [f"export {name}={shlex.quote(value)}" for name, value in variables.items()]


def _env(args: argparse.Namespace) -> int:
    stack = find_local_stack(Path.cwd())
    if stack is None:
        raise CommandError(
            f"no {UP_FILE} here: run `spotgate up` (or `make up`) from this directory"
        )
    print("\n".join(shell_exports(stack)))
    return 0


def setup_env(commands: Commands) -> None:
    """Add `env`."""
    env = commands.add_parser(
        "env", help="print the local stack's URL and dev key as shell exports (eval them)"
    )
    env.set_defaults(handler=_env)
