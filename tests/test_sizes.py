"""Sizes a reader can hold: source files, functions and the code map (ARCHITECTURE.md)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE_ROOTS = ("spotgate", "gateway", "gpu_agent", "pool_manager", "stack", "loadtest", "cli")
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 100
MAX_MAP_LINES = 250


def source_files() -> list[Path]:
    """Every Python file of the packages and the CDK app, tests left out."""
    cdk = [path for path in (ROOT / "infra" / "cdk").rglob("*.py") if "tests" not in path.parts]
    return sorted([*(p for root in SOURCE_ROOTS for p in (ROOT / root).rglob("*.py")), *cdk])


def functions(module: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function a module defines. A `def` is a statement, found only in statements'
    bodies (and their handlers' and cases'): the expressions, most of a tree, are not walked."""
    pending: list[ast.AST] = list(module.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            pending.extend(getattr(node, field, ()))


def test_no_source_file_is_over_500_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for path in source_files()
        if (lines := len(path.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert long == {}


def test_no_function_is_over_100_lines() -> None:
    long = {
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name}": lines
        for path in source_files()
        for node in functions(ast.parse(path.read_text(), str(path)))
        if (lines := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_FUNCTION_LINES
    }
    assert long == {}


def test_the_code_map_is_a_map_not_a_diary() -> None:
    assert len((ROOT / "ARCHITECTURE.md").read_text().splitlines()) <= MAX_MAP_LINES
