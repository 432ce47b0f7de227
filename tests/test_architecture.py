"""ARCHITECTURE.md names every package, wire frame type and error code that exists."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

from msgspec import Struct
from pydantic import BaseModel

from spotgate import protocol

FrameModel = type[BaseModel] | type[Struct]

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
PROJECT_ROOTS = (ROOT, ROOT / "infra" / "cdk")
"""Where top-level packages live: the repository, and the CDK app (run from its own folder)."""


def packages(project_root: Path) -> set[str]:
    """The top-level packages under `project_root` and their subpackages, as `a/b/`."""
    found: set[str] = set()
    pending = [path for path in project_root.iterdir() if path.is_dir()]
    while pending:
        directory = pending.pop()
        if directory.name.startswith(".") or not (directory / "__init__.py").is_file():
            continue
        found.add(f"{directory.relative_to(ROOT).as_posix()}/")
        pending.extend(path for path in directory.iterdir() if path.is_dir())
    return found


def frame_models(annotation: Any) -> set[FrameModel]:
    """The frame models of a (possibly annotated) union of them."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel | Struct):
        return {annotation}
    if get_origin(annotation) is Annotated:
        return frame_models(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return {model for member in get_args(annotation) for model in frame_models(member)}
    return set()


def frame_types() -> set[str]:
    """The `type` of every frame: those the protocol parses, sends, or defines as a frame."""
    models = frame_models(protocol.ClientFrame) | frame_models(protocol.ServerFrame)
    models |= frame_models(protocol.AnyFrame)
    models |= {
        value
        for name, value in vars(protocol).items()
        if name.endswith("Frame")
        and isinstance(value, type)
        and issubclass(value, BaseModel | Struct)
    }
    return {frame_type(model) for model in models}


def frame_type(model: FrameModel) -> str:
    """A frame model's `type`: a pydantic model's default, a msgspec struct's tag."""
    if issubclass(model, Struct):
        return str(model.__struct_config__.tag)
    return str(model.model_fields["type"].default)


def unnamed(document: str, names: set[str]) -> list[str]:
    """The names the document does not mention in backticks (`name`)."""
    return sorted(name for name in names if f"`{name}`" not in document)


def test_every_package_is_named() -> None:
    found = set().union(*(packages(root) for root in PROJECT_ROOTS))
    assert {"spotgate/registry/", "gateway/routes/", "infra/cdk/stacks/"} <= found
    assert unnamed(ARCHITECTURE.read_text(), found) == []


def test_every_wire_frame_type_is_named() -> None:
    found = frame_types()
    assert {"generate", "delta", "done", "error", "start", "queued", "cancel"} <= found
    assert unnamed(ARCHITECTURE.read_text(), found) == []


def test_every_error_code_is_named() -> None:
    found = {code.value for code in protocol.ErrorCode}
    assert {"interrupted", "going_away", "no_capacity"} <= found
    assert unnamed(ARCHITECTURE.read_text(), found) == []


def test_a_name_the_document_leaves_out_is_reported() -> None:
    document = "`gateway/` routes `generate`; delta and gateway/routes/ are only prose."
    names = {"gateway/", "gateway/routes/", "generate", "delta"}
    assert unnamed(document, names) == ["delta", "gateway/routes/"]
