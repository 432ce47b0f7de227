"""MkDocs hook: README.md and ARCHITECTURE.md are pages of the site, their links kept working.

The two documents live at the repository's root, where a reader of the repository finds them,
and link as seen from there (`docs/benchmarks.md`, `gateway/prefix.py`). The site serves them
as `index.md` and `architecture.md` beside the pages of `docs/`: links to a page are
rewritten to the page's name on the site, and links to a file that is not a page (source code)
become its text, since the site does not serve the code. `mkdocs build --strict` then fails on
any link left that leads nowhere.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT_PAGES = {"README.md": "index.md", "ARCHITECTURE.md": "architecture.md"}
"""Root documents and their names on the site."""
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def _repository(config: MkDocsConfig) -> Path:
    return Path(config.config_file_path).parent


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the root documents as pages, read from where the repository keeps them."""
    for document, page in ROOT_PAGES.items():
        content = (_repository(config) / document).read_text()
        files.append(File.generated(config, page, content=content))
    return files


def site_target(target: str, page_dir: str, repository: Path) -> str | None:
    """Where a relative link of a page in `page_dir` (from the repository's root) leads.

    A page's or an image's name on the site; None for a file of the repository the site does
    not serve; the link itself when it leads to nothing, for the build to report.
    """
    path, _, anchor = target.partition("#")
    parts: list[str] = []
    for part in Path(page_dir, path).as_posix().split("/"):
        if part == "..":
            if not parts:
                return target  # out of the repository
            parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    from_root = "/".join(parts)
    if from_root in ROOT_PAGES:
        name = ROOT_PAGES[from_root]
    elif from_root.startswith("docs/"):
        name = from_root.removeprefix("docs/")
    elif (repository / from_root).exists():
        return None
    else:
        return target
    return name + (f"#{anchor}" if anchor else "")


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Rewrite the page's relative links as seen from the site's pages."""
    source = page.file.src_uri
    site_dir = Path(source).parent.as_posix()
    if source in ROOT_PAGES.values():
        page_dir = "."
    else:
        page_dir = "docs" if site_dir == "." else f"docs/{site_dir}"
    repository = _repository(config)

    def rewrite(match: re.Match[str]) -> str:
        bang, text, target = match.groups()
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", target):
            return match.group(0)  # absolute, an anchor on the page, or rooted: left as it is
        leads_to = site_target(target, page_dir, repository)
        if leads_to is None:
            return match.group(0) if bang else text
        if site_dir != ".":
            leads_to = os.path.relpath(leads_to, site_dir)
        return f"{bang}[{text}]({leads_to})"

    return LINK.sub(rewrite, markdown)
