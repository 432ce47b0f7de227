"""A small multiplexing client over the official `websockets` package, for agent tests."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection

Frame = dict[str, Any]


def connect(url: str, token: str | None) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    return websockets.connect(url, additional_headers=headers, max_size=2**22)


async def send(ws: ClientConnection, frame: Frame) -> None:
    await ws.send(json.dumps(frame))


async def receive(ws: ClientConnection) -> Frame:
    frame: Frame = json.loads(await ws.recv())
    return frame


async def receive_to_end(ws: ClientConnection, frames: list[Frame]) -> None:
    """Receive one stream's frames into `frames` until the last is its `done` or `error`."""
    while frames[-1]["type"] not in ("done", "error"):
        frames.append(await receive(ws))


async def run_streams(ws: ClientConnection, *frames: Frame) -> dict[str, list[Frame]]:
    """Send `generate` frames and collect every stream's frames until each ends."""
    for frame in frames:
        await send(ws, frame)
    pending = {frame["id"] for frame in frames}
    seen: dict[str, list[Frame]] = defaultdict(list)
    while pending:
        frame = await receive(ws)
        seen[frame.get("id", "")].append(frame)
        if frame["type"] in ("done", "error") and frame.get("id") in pending:
            pending.discard(frame["id"])
    return dict(seen)


def text_of(frames: list[Frame]) -> str:
    return "".join(frame["text"] for frame in frames if frame["type"] == "delta")


def ids_of(frames: list[Frame]) -> list[int]:
    return [token for frame in frames if frame["type"] == "delta" for token in frame["ids"]]


def generate(stream_id: str, model: str, content: str = "Hello there", **extra: Any) -> Frame:
    return {
        "type": "generate",
        "id": stream_id,
        "model": model,
        "messages": [{"role": "user", "content": content}],
        **extra,
    }
