"""What every `spotgate` command shares: one-line errors, argument types, the stack's settings."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, NoReturn

from spotgate.process import EXIT_BAD_INPUT
from spotgate.settings import SharedSettings
from stack.local import find_local_stack

EXIT_INTERRUPTED = 130
"""What a shell reports for a command ended by Ctrl-C (128 + SIGINT)."""

Handler = Callable[[argparse.Namespace], int]
Commands = Any  # argparse's private `_SubParsersAction`: what `add_subparsers` returns


class CommandError(Exception):
    """A command could not do what was asked; the message is the one line to print."""


class OneLineParser(argparse.ArgumentParser):
    """An argument parser that reports a bad command line as one line, then exits 2."""

    def error(self, message: str) -> NoReturn:
        """Print `<prog>: <message> (see --help)` and exit with status 2."""
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: {message} (see {self.prog} --help)\n")


def whole_number_at_least(minimum: int) -> Callable[[str], int]:
    """An argument type: a whole number, `minimum` or more."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from err
        if value < minimum:
            least = "zero or more" if minimum == 0 else f"at least {minimum}"
            raise argparse.ArgumentTypeError(f"{text!r} must be {least}")
        return value

    return parse


positive_int = whole_number_at_least(1)
non_negative_int = whole_number_at_least(0)


def non_negative_float(text: str) -> float:
    """An argument type: a number, zero or more."""
    try:
        value = float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from err
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be zero or more")
    return value


def positive_float(text: str) -> float:
    """An argument type: a number above zero."""
    value = non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than zero")
    return value


def share(text: str) -> float:
    """An argument type: a share, from 0 to 1."""
    value = non_negative_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be between 0 and 1")
    return value


def shared_settings() -> SharedSettings:
    """Settings of the local stack started here (`.spotgate/up.json`), else the environment."""
    stack = find_local_stack(Path.cwd())
    return SharedSettings() if stack is None else stack.shared_settings()


def run_async(handler: Callable[[argparse.Namespace], Coroutine[Any, Any, int]]) -> Handler:
    """A handler that runs the coroutine `handler` to completion."""

    def run(args: argparse.Namespace) -> int:
        return asyncio.run(handler(args))

    return run


def region_list(text: str) -> tuple[str, ...]:
    """An argument type: regions, comma-separated."""
    regions = tuple(region.strip() for region in text.split(","))
    if not all(regions):
        raise argparse.ArgumentTypeError(f"{text!r}: an empty region")
    return regions
