"""`spotgate up`: the system on one machine (DESIGN.md §7), and how other commands find it.

It starts an embedded AWS emulator (moto server, real HTTP) with spotgate's tables, creates a
dev API key, and records both in `.spotgate/up.json` so that `spotgate keys …` run from the
same directory act on this stack. The services join it as they are built.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from spotgate.registry import Registry
from spotgate.settings import SharedSettings, emulator_settings

UP_FILE = Path(".spotgate") / "up.json"


@dataclass(frozen=True, slots=True)
class UpOptions:
    """What `spotgate up` was asked to run."""

    port: int = 8080
    agents: int = 1
    engine: str = "vllm"
    model: Path | None = None

    def pending_parts(self) -> str:
        """The parts asked for that this version cannot start yet."""
        model = self.model or "the tiny model"
        return (
            f"gateway on :{self.port}, {self.agents} {self.engine} agent(s) on {model}, "
            "pool manager"
        )


@dataclass(frozen=True, slots=True)
class LocalStackInfo:
    """What `spotgate up` started, as written to `.spotgate/up.json`."""

    aws_endpoint_url: str
    region: str
    api_key: str
    gateway_url: str | None = None
    chat_url: str | None = None

    def describe(self, options: UpOptions) -> str:
        """The one line `spotgate up` prints once its parts answer."""
        return (
            f"spotgate up: AWS emulator={self.aws_endpoint_url} (tables created) "
            f"key={self.api_key}; not built yet: {options.pending_parts()}; Ctrl-C stops"
        )

    def shared_settings(self) -> SharedSettings:
        """Shared settings that reach this stack's AWS emulator."""
        return emulator_settings(self.aws_endpoint_url, self.region)


def find_local_stack(directory: Path) -> LocalStackInfo | None:
    """The stack `spotgate up` runs from `directory`, if its `up.json` is there."""
    path = directory / UP_FILE
    try:
        document = json.loads(path.read_text())
        return LocalStackInfo(**document)
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as err:
        raise ValueError(f"{path} is not a spotgate up file; delete it") from err


def _write_up_file(directory: Path, info: LocalStackInfo) -> Path:
    path = directory / UP_FILE
    path.parent.mkdir(exist_ok=True)
    # It holds the dev key: readable by its owner only.
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(asdict(info), handle, indent=2)
    return path


async def run_up(directory: Path, options: UpOptions, *, announce: Callable[[str], None]) -> int:
    """Start the local stack, announce it, and run until SIGINT or SIGTERM."""
    from spotgate.emulator import EMULATOR_REGION, AwsEmulator  # moto is heavy: only `up` needs it

    emulator = AwsEmulator()
    emulator.start()
    up_file = directory / UP_FILE
    try:
        async with Registry.open(emulator.settings()) as registry:
            await registry.create_tables()
            created = await registry.create_key("dev")
        info = LocalStackInfo(
            aws_endpoint_url=emulator.url, region=EMULATOR_REGION, api_key=created.api_key
        )
        _write_up_file(directory, info)
        announce(info.describe(options))
        await _wait_for_stop_signal()
    finally:
        up_file.unlink(missing_ok=True)
        emulator.stop()
    return 0


async def _wait_for_stop_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
