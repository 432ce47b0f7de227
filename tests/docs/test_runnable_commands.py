"""The docs' commands run as written: each block marked `<!-- runnable -->` runs here.

A reader copies them into a shell where `make up` runs in the repository: so each runs in the
directory of a `spotgate up` (synthetic agents, for speed; the commands do not depend on the
engine), with `.venv` there. A `bash` block runs with `-euo pipefail`; a `python` block runs
with the venv's Python in a shell that evaluated `spotgate env`, as the docs tell readers to.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.up import running_up

REPOSITORY = Path(__file__).resolve().parents[2]
MARK = "<!-- runnable -->"
FENCE = re.compile(r"^```(\w+)\s*$")
RUNNERS = {
    "bash": ["bash", "-euo", "pipefail", "-c"],
    "python": ["bash", "-euo", "pipefail", "-c", 'eval "$(.venv/bin/spotgate env)"; exec "$0" -'],
}
"""How each kind of block runs: its text as the last argument, or (python) on stdin."""
BLOCK_TIMEOUT_SECONDS = 60.0
UP_ENV = {"SPOTGATE_AGENT_SYNTHETIC__TOKENS_PER_SECOND": "2000"}
"""The synthetic agents' pace: what a block prints does not depend on it, its time does."""


@dataclass(frozen=True)
class Block:
    """One marked block of a document: where it is, its language and its text."""

    where: str
    language: str
    text: str


def documents() -> list[Path]:
    """Every page of the docs, the root documents first."""
    pages = sorted((REPOSITORY / "docs").rglob("*.md"))
    return [REPOSITORY / "README.md", REPOSITORY / "ARCHITECTURE.md", *pages]


def marked_blocks(path: Path) -> list[Block]:
    """The fenced blocks that follow a `<!-- runnable -->` line in `path`."""
    lines = path.read_text().splitlines()
    blocks = []
    for number, line in enumerate(lines):
        if line.strip() != MARK:
            continue
        opening = FENCE.match(lines[number + 1]) if number + 1 < len(lines) else None
        if opening is None or opening.group(1) not in RUNNERS:
            raise AssertionError(f"{path.name}:{number + 1}: {MARK} not before a bash/python fence")
        end = lines.index("```", number + 2)
        where = f"{path.relative_to(REPOSITORY)}:{number + 2}"
        blocks.append(Block(where, opening.group(1), "\n".join(lines[number + 2 : end])))
    return blocks


BLOCKS = [block for path in documents() if path.exists() for block in marked_blocks(path)]


def test_the_first_request_of_the_readme_is_among_the_blocks_run() -> None:
    readme = [block for block in BLOCKS if block.where.startswith("README.md")]
    assert {block.language for block in readme} == {"bash", "python"}


@pytest.fixture(scope="module")
def up_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("docs-up")
    (directory / ".venv").symlink_to(Path(sys.prefix))
    with running_up(directory, ["--engine", "synthetic", "--port", "0"], UP_ENV):
        yield directory


@pytest.mark.parametrize("block", BLOCKS, ids=[block.where for block in BLOCKS])
def test_a_marked_block_runs_as_written(block: Block, up_directory: Path) -> None:
    runner = RUNNERS[block.language]
    if block.language == "python":
        command, stdin = [*runner, str(up_directory / ".venv" / "bin" / "python")], block.text
    else:
        command, stdin = [*runner, block.text], None
    result = subprocess.run(
        command,
        cwd=up_directory,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_SECONDS,
        env={**os.environ, "PATH": f"{up_directory / '.venv' / 'bin'}:{os.environ['PATH']}"},
        check=False,
    )
    assert result.returncode == 0, f"{block.where}\n{result.stdout}\n{result.stderr}"
    assert result.stdout.strip(), f"{block.where} printed nothing"
