"""Hypothesis websocket frames on one socket per service: it lives on or closes as documented."""

from __future__ import annotations

import itertools
import socket
import time
from typing import Any

import websockets
import websockets.sync.client
from hypothesis import given

from loadtest.hostile.client import (
    PING,
    REQUEST_TIMEOUT_SECONDS,
    fresh_address,
    generate_frame,
)
from loadtest.hostile.limits import DOCUMENTED_CLOSE_CODES, MAX_FRAME_BYTES
from loadtest.hostile.report import Row
from loadtest.hostile.strategies import WS_PAYLOADS, hypothesis_settings
from spotgate.protocol import DoneFrame, ErrorFrame, FrameError, PongFrame, parse_frame


class WsProbe:
    """One socket to a service, reopened when the server closes it (blocking, for a thread)."""

    def __init__(self, url: str, credential: str, row: Row) -> None:
        self._url = url
        self._credential = credential
        self._row = row
        self._ws: websockets.sync.client.ClientConnection | None = None
        self._ids = itertools.count()

    def _socket(self) -> websockets.sync.client.ClientConnection:
        if self._ws is None:
            host, port = self._url.removeprefix("ws://").split("/")[0].split(":")
            sock = socket.create_connection((host, int(port)), source_address=(fresh_address(), 0))
            self._ws = websockets.sync.client.connect(
                self._url,
                sock=sock,
                additional_headers={"Authorization": f"Bearer {self._credential}"},
                max_size=None,
                compression=None,
                proxy=None,
                open_timeout=REQUEST_TIMEOUT_SECONDS,
                close_timeout=2,
                legacy=True,  # held open across hypothesis examples, not in a `with` block
            )
        return self._ws

    def close(self) -> None:
        """Close the socket if open."""
        if self._ws is not None:
            self._ws.close()
            self._ws = None

    def exchange(self, data: str | bytes, text: bool) -> None:
        """Send one payload and a ping; record what came back before the pong."""
        ws = self._socket()
        seen: list[Any] = []
        try:
            ws.send(data, text=text)
            ws.send(PING)
            while True:
                raw = ws.recv(timeout=REQUEST_TIMEOUT_SECONDS)
                try:
                    frame = parse_frame(raw, origin="server", max_bytes=16 * 1024 * 1024)
                except FrameError as err:
                    self._row.record("invalid server frame", f"server sent {raw[:80]!r}: {err}")
                    return
                if isinstance(frame, PongFrame):
                    break
                seen.append(frame)
        except websockets.ConnectionClosed as err:
            self._ws = None
            code = err.rcvd.code if err.rcvd is not None else None
            if code is None and len(data) > MAX_FRAME_BYTES:
                # Refused (1009) while still being written: the close frame may be lost.
                self._row.record("connection dropped (frame over 64 KiB)")
                return
            reason = DOCUMENTED_CLOSE_CODES.get(code or 0)
            problem = None if reason else f"closed with {code} after {str(data)[:80]!r}"
            self._row.record(f"close {code} ({reason or 'undocumented'})", problem)
            return
        except TimeoutError:
            self._row.record("no pong", f"no pong after {str(data)[:80]!r}")
            return
        codes = sorted({frame.code.value for frame in seen if isinstance(frame, ErrorFrame)})
        what = (
            f"error frame {'/'.join(codes)}" if codes else "stream frames" if seen else "no reply"
        )
        self._row.record(f"{what}, socket lives")

    def generate_works(self, reopened: bool = False) -> str | None:
        """A valid stream on this socket (reopened if it was closed); why not, or None."""
        ws = self._socket()
        stream_id = f"check-{next(self._ids)}"
        deadline = time.monotonic() + REQUEST_TIMEOUT_SECONDS
        try:
            ws.send(generate_frame(stream_id))
            while time.monotonic() < deadline:
                frame = parse_frame(ws.recv(timeout=REQUEST_TIMEOUT_SECONDS), origin="server")
                if getattr(frame, "id", None) != stream_id:
                    continue
                if isinstance(frame, DoneFrame):
                    return None
                if isinstance(frame, ErrorFrame):
                    return f"valid generate refused: {frame.code.value} {frame.message}"
        except websockets.ConnectionClosed as err:
            # An earlier oversized or invalid frame may close the socket only now (documented).
            self._ws = None
            code = err.rcvd.code if err.rcvd is not None else None
            if (code is None or code in DOCUMENTED_CLOSE_CODES) and not reopened:
                return self.generate_works(reopened=True)
            return f"socket closed with {code} under a valid generate"
        return "valid generate did not finish"


def fuzz_websocket(target: str, url: str, credential: str, examples: int) -> Row:
    """Hypothesis frames on one socket; every so often, and at the end, a valid stream."""
    row = Row(
        target,
        "ws frames (hypothesis): JSON of wrong shapes and types, non-JSON text, "
        "unicode, nesting depth, frames near/over 64 KiB, invalid UTF-8, binary",
    )
    probe = WsProbe(url, credential, row)
    checks = itertools.count(1)

    @hypothesis_settings(examples)
    @given(WS_PAYLOADS)
    def run(payload: tuple[str | bytes, bool]) -> None:
        probe.exchange(*payload)
        if next(checks) % 25 == 0 and (problem := probe.generate_works()) is not None:
            row.problems.append(problem)

    run()
    for problem in (probe.generate_works(), WsProbe(url, credential, row).generate_works()):
        if problem is not None:
            row.problems.append(problem)
    probe.close()
    row.notes.append("a valid stream after every 25 inputs and on a fresh socket: done")
    return row
