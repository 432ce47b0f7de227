"""`spotgate env`: the local stack as shell exports, quoted for any value."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cli.args import CommandError
from cli.env import shell_exports
from stack.local import LocalStackInfo


def stack(**fields: str) -> LocalStackInfo:
    values = {"aws_endpoint_url": "http://127.0.0.1:5000", "region": "us-east-1", "api_key": "k"}
    return LocalStackInfo(**{**values, **fields})


def test_the_exports_evaluated_by_a_shell_give_back_each_value() -> None:
    url = "http://127.0.0.1:8080"
    key = "sg-abc-it's $(not run)"  # quoting holds whatever a value holds
    exports = shell_exports(stack(gateway_url=url, api_key=key, model="tiny"))
    script = "\n".join(
        [*exports, 'printf "%s\\n" "$SPOTGATE_KEY" "$OPENAI_BASE_URL" "$SPOTGATE_MODEL"']
    )
    shown = subprocess.run(["/bin/bash", "-c", script], capture_output=True, text=True, check=True)
    assert shown.stdout.splitlines() == [key, f"{url}/v1", "tiny"]


def test_a_stack_without_a_gateway_has_nothing_to_export() -> None:
    with pytest.raises(CommandError, match="no gateway"):
        shell_exports(stack(model="tiny"))


def test_env_outside_a_stack_directory_says_how_to_start_one(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cli", "env"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "spotgate env: no .spotgate/up.json here: "
        "run `spotgate up` (or `make up`) from this directory"
    )
