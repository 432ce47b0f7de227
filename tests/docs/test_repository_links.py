"""The docs site's links: root documents' links lead to site pages, code links become text."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location(
    "repository_links", REPOSITORY / "docs" / "hooks" / "repository_links.py"
)
assert _SPEC is not None
assert _SPEC.loader is not None
repository_links = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(repository_links)


@pytest.mark.parametrize(
    ("target", "page_dir", "leads_to"),
    [
        ("docs/benchmarks.md", ".", "benchmarks.md"),  # README → a page of docs/
        ("docs/benchmarks.md#prefix", ".", "benchmarks.md#prefix"),
        ("docs/chat-page.png", ".", "chat-page.png"),
        ("ARCHITECTURE.md", ".", "architecture.md"),
        ("../README.md", "docs", "index.md"),  # a page of docs/ → the README
        ("reliability.md", "docs", "reliability.md"),
        ("gateway/prefix.py", ".", None),  # code: the site does not serve it
        ("../gateway/prefix.py", "docs", None),
        ("docs/missing.md", ".", "missing.md"),  # left for the build to report
        ("gateway/missing.py", ".", "gateway/missing.py"),
        ("../../outside.md", "docs", "../../outside.md"),
    ],
)
def test_a_link_leads_where_the_site_serves_it(
    target: str, page_dir: str, leads_to: str | None
) -> None:
    assert repository_links.site_target(target, page_dir, REPOSITORY) == leads_to
