"""The chat page's libraries: the pinned manifest, the fetch that checks every file's sha384."""

from __future__ import annotations

import io
import json
import re
import tarfile
from pathlib import Path

import pytest
from structlog.testing import capture_logs

import spotgate.npm
from gateway.chat_vendor import (
    LibraryError,
    LibraryFile,
    check_libraries,
    fetch_libraries,
    integrity_of,
    load_manifest,
    main,
)
from gateway.routes.chat_page import library_tags
from spotgate.npm import tarball_name

MARKED = b"export const marked = 1;\n"
THEME = b".hljs { color: red }\n"


def pack(cache: Path, name: str, version: str, files: dict[str, bytes]) -> None:
    """A tarball laid out as npm publishes one, where `npm pack` would put it."""
    cache.mkdir(parents=True, exist_ok=True)
    with tarfile.open(cache / tarball_name(name, version), "w:gz") as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(f"package/{path}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def pinned(data: bytes = MARKED) -> list[LibraryFile]:
    return [
        LibraryFile("marked", "1.2.3", "lib/marked.esm.js", "marked", integrity_of(data)),
        LibraryFile("@scope/theme", "4.5.6", "styles/dark.css", "theme", integrity_of(THEME)),
    ]


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    cache = tmp_path / "cache"
    pack(cache, "marked", "1.2.3", {"lib/marked.esm.js": MARKED, "README.md": b"hi"})
    pack(cache, "@scope/theme", "4.5.6", {"styles/dark.css": THEME})
    return cache


def test_each_pinned_file_is_checked_and_installed_whole(cache: Path, tmp_path: Path) -> None:
    into = tmp_path / "static" / "vendor"
    assert fetch_libraries(pinned(), cache, into) is True
    assert (into / "marked@1.2.3/lib/marked.esm.js").read_bytes() == MARKED
    assert (into / "@scope/theme@4.5.6/styles/dark.css").read_bytes() == THEME
    assert sorted(p.name for p in into.rglob("*") if p.is_file()) == ["dark.css", "marked.esm.js"]
    assert check_libraries(pinned(), into) == []
    assert fetch_libraries(pinned(), cache, into) is False  # there already, as pinned
    assert [p.name for p in into.parent.iterdir()] == ["vendor"]  # no staging left behind


def test_a_file_that_is_not_the_pinned_one_is_refused_and_nothing_changes(
    cache: Path, tmp_path: Path
) -> None:
    into = tmp_path / "vendor"
    fetch_libraries(pinned(), cache, into)
    # The manifest now pins other bytes than the package holds (a changed or poisoned file).
    with pytest.raises(LibraryError, match=r"lib/marked.esm.js is sha384-.*refusing it"):
        fetch_libraries(pinned(b"something else"), cache, into)
    assert (into / "marked@1.2.3/lib/marked.esm.js").read_bytes() == MARKED
    assert check_libraries(pinned(b"something else"), into) == [
        "marked@1.2.3/lib/marked.esm.js is not the pinned file"
    ]


def test_a_file_missing_from_its_package_is_refused(cache: Path, tmp_path: Path) -> None:
    files = [LibraryFile("marked", "1.2.3", "lib/gone.js", "marked", integrity_of(MARKED))]
    with pytest.raises(LibraryError, match=r"marked-1.2.3.tgz has no lib/gone.js"):
        fetch_libraries(files, cache, tmp_path / "vendor")
    assert not (tmp_path / "vendor").exists()


def test_without_npm_an_uncached_package_cannot_be_fetched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spotgate.npm.shutil, "which", lambda _name: None)
    with pytest.raises(LibraryError, match=r"npm is needed to fetch marked@1.2.3"):
        fetch_libraries(pinned(), tmp_path / "empty", tmp_path / "vendor")


def test_the_command_says_what_it_did_and_fails_on_a_mismatch(
    cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "vendor.json"
    entries = [
        {"name": f.package, "version": f.version, "files": [
            {"path": f.path, "role": f.role, "integrity": f.integrity}]}
        for f in pinned()
    ]  # fmt: skip
    manifest.write_text(json.dumps({"packages": entries}))
    args = ["--cache", str(cache), "--into", str(tmp_path / "vendor"), "--manifest", str(manifest)]
    assert main(args) == 0
    assert "2 files fetched and verified" in capsys.readouterr().out
    assert main([*args, "--print-integrity"]) == 0
    assert f"marked@1.2.3 lib/marked.esm.js {integrity_of(MARKED)}" in capsys.readouterr().out

    entries[0]["files"][0]["integrity"] = integrity_of(b"other")  # type: ignore[index]
    manifest.write_text(json.dumps({"packages": entries}))
    (tmp_path / "vendor" / "marked@1.2.3/lib/marked.esm.js").unlink()
    assert main(args) == 1
    assert "refusing it" in capsys.readouterr().err


def test_the_manifest_pins_exact_versions_and_a_sha384_per_file() -> None:
    files = load_manifest()
    assert {file.role for file in files} == {"marked", "dompurify", "highlight", "highlight-theme"}
    for file in files:
        assert re.fullmatch(r"\d+\.\d+\.\d+", file.version)
        assert re.fullmatch(r"sha384-[A-Za-z0-9+/]{64}", file.integrity)
    assert [file.path for file in files if file.is_style] == ["styles/github-dark.min.css"]


def manifest_with(**changes: str) -> str:
    file = {"path": "lib/x.js", "role": "marked", "integrity": integrity_of(b"")}
    package = {"name": "marked", "version": "1.2.3"}
    for key, value in changes.items():
        (file if key in file else package)[key] = value
    return json.dumps({"packages": [{**package, "files": [file]}]})


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        manifest_with(version="^1.2.3"),  # a range: not one exact file
        manifest_with(version="latest"),
        manifest_with(path="../../etc/passwd"),
        manifest_with(integrity="sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="),
        manifest_with(name="Not A Package"),
    ],
)
def test_a_manifest_that_does_not_pin_exactly_is_refused(tmp_path: Path, text: str) -> None:
    manifest = tmp_path / "vendor.json"
    manifest.write_text(text)
    with pytest.raises(LibraryError):
        load_manifest(manifest)


def test_the_gateway_offers_only_verified_libraries_and_warns_otherwise(tmp_path: Path) -> None:
    with capture_logs() as logs:
        assert library_tags(tmp_path) == ""  # nothing fetched here
    assert logs[0]["log_level"] == "warning"
    assert "plain text" in logs[0]["event"]
    assert len(logs[0]["problems"]) == len(load_manifest())
