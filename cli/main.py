"""The `spotgate` command line (ARCHITECTURE.md): one module per command group, wired here.

argparse rather than click or typer: it is in the standard library, types cleanly under
`mypy --strict`, and subcommands nest as far as we need. Every bad input exits with status 2
and one line saying what was wrong.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError

from cli.args import EXIT_INTERRUPTED, CommandError, Commands, OneLineParser
from cli.env import setup_env
from cli.keys import setup_keys
from cli.loadtest import setup_loadtest
from cli.model import setup_model
from cli.pool import setup_pool
from cli.services import setup_services
from cli.sim import setup_sim
from spotgate import __version__
from spotgate.process import EXIT_BAD_INPUT
from spotgate.settings import describe_validation_error

EXIT_AWS_FAILED = 4

COMMAND_GROUPS: tuple[Callable[[Commands], None], ...] = (
    setup_services,
    setup_env,
    setup_keys,
    setup_pool,
    setup_model,
    setup_sim,
    setup_loadtest,
)
"""Every command group, in the order `--help` lists them."""


def build_parser() -> argparse.ArgumentParser:
    """The full `spotgate` command tree."""
    parser = OneLineParser(prog="spotgate", description="LLM serving on EC2 spot GPUs.")
    parser.add_argument("--version", action="version", version=f"spotgate {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for setup in COMMAND_GROUPS:
        setup(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command `argv` names (None: the process's arguments); its exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except ValidationError as err:
        print(f"spotgate {args.command}: {describe_validation_error(err)}", file=sys.stderr)
    except CommandError as err:
        print(f"spotgate {args.command}: {err}", file=sys.stderr)
    except (BotoCoreError, ClientError) as err:
        print(f"spotgate {args.command}: AWS request failed: {err}", file=sys.stderr)
        return EXIT_AWS_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return EXIT_BAD_INPUT
