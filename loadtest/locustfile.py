r"""Locust users for spotgate: websocket streams, OpenAI SSE streams, token issue.

    locust -f loadtest/locustfile.py --host http://127.0.0.1:8080 --api-key sg-… \
        [--model NAME] [--workload prompts.jsonl] [--cancel-share 0.1] \
        [--streams-per-user 1] [--metrics-out llm.json] [--replicas URL,URL]

`--replicas` names more gateways of the same deployment (`spotgate up --gateways N` lists
them in `up.json`): users are spread over `--host` and them in turn, each keeping its own.

Besides locust's own request stats (one `generate` entry per stream, its response time the
whole stream), every stream feeds LLM metrics: `ttft` entries (time to first token, ms), a
`tokens/s per stream` entry (its "response time" column is the decode rate, in tokens per
second), and failures by error code (`error <code>`). `--metrics-out` writes the LLM summary
(percentiles of TTFT, inter-token gaps, per-stream and total tokens/s, queue time, streams
resumed, failures by code) as JSON when the test stops. `spotgate loadtest` runs this file.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import time
import uuid
from pathlib import Path
from typing import Any

import gevent
import websocket
from gevent.queue import Empty, Queue
from locust import HttpUser, between, constant, events, task
from locust.env import Environment

from loadtest.llm_metrics import LlmMetrics, StreamResult
from loadtest.workload import Request, Workload, builtin_workload, load_workload

WS_TIMEOUT_SECONDS = 120.0
CANCEL_AFTER_TOKENS = 5
TOKEN_REFRESH_MARGIN_SECONDS = 10.0

METRICS = LlmMetrics()
_RUN: dict[str, float] = {}


@events.init_command_line_parser.add_listener  # type: ignore[untyped-decorator]
def _arguments(parser: Any) -> None:
    parser.add_argument("--api-key", default=os.environ.get("SPOTGATE_API_KEY", ""))
    parser.add_argument("--model", default=os.environ.get("SPOTGATE_MODEL", ""))
    parser.add_argument("--workload", default="", help="JSONL file of prompts (default: mix)")
    parser.add_argument("--cancel-share", type=float, default=0.0, help="streams to cancel")
    parser.add_argument("--streams-per-user", type=int, default=1, help="concurrent, per socket")
    parser.add_argument("--metrics-out", default="", help="where to write the LLM summary")
    parser.add_argument("--replicas", default="", help="more gateways, comma-separated")


_WORKLOAD: list[Workload] = []


@events.test_start.add_listener  # type: ignore[untyped-decorator]
def _started(environment: Environment, **_kwargs: Any) -> None:
    options = environment.parsed_options
    path = getattr(options, "workload", "") if options else ""
    _WORKLOAD[:] = [load_workload(Path(path)) if path else builtin_workload()]
    _RUN["started"] = time.time()


@events.test_stop.add_listener  # type: ignore[untyped-decorator]
def _stopped(environment: Environment, **_kwargs: Any) -> None:
    options = environment.parsed_options
    out = getattr(options, "metrics_out", "") if options else ""
    if out:
        duration = time.time() - _RUN.get("started", time.time())
        summary = METRICS.summary(duration)
        summary["duration_seconds"] = duration
        Path(out).write_text(json.dumps(summary, indent=2))


def _option(user: HttpUser, name: str) -> Any:
    return getattr(user.environment.parsed_options, name)


def _report(user: HttpUser, kind: str, result: StreamResult) -> None:
    """Feed one stream to locust's stats and to the LLM metrics."""
    METRICS.record(result)
    fire = user.environment.events.request.fire
    failure = None if result.error is None else RuntimeError(result.error)
    fire(request_type=kind, name="generate", response_time=result.total_seconds * 1000,
         response_length=result.tokens, exception=failure, context={})  # fmt: skip
    if result.error is not None:
        fire(request_type=kind, name=f"error {result.error}", response_time=0,
             response_length=0, exception=failure, context={})  # fmt: skip
        return
    if result.ttft_seconds is not None:
        fire(request_type=kind, name="ttft", response_time=result.ttft_seconds * 1000,
             response_length=0, exception=None, context={})  # fmt: skip
        decode = result.total_seconds - result.ttft_seconds
        if result.tokens > 1 and decode > 0:
            fire(request_type=kind, name="tokens/s per stream",
                 response_time=(result.tokens - 1) / decode, response_length=result.tokens,
                 exception=None, context={})  # fmt: skip


def _model(user: HttpUser) -> str:
    model = str(_option(user, "model"))
    if model:
        return model
    response = user.client.get("/v1/models", name="/v1/models", headers=_auth(user))
    data = response.json().get("data", []) if response.ok else []
    if not data:
        raise RuntimeError("no model served; pass --model")
    return str(data[0]["id"])


_USERS_STARTED = itertools.count()


def _spread(user: HttpUser) -> None:
    """Point this user at the next gateway in turn: `--host`, then each of `--replicas`."""
    replicas = [url for url in _option(user, "replicas").split(",") if url]
    if replicas:
        hosts = [str(user.host), *replicas]
        user.host = hosts[next(_USERS_STARTED) % len(hosts)]
        user.client.base_url = user.host


def _auth(user: HttpUser) -> dict[str, str]:
    return {"Authorization": f"Bearer {_option(user, 'api_key')}"}


def _next_request() -> Request:
    return _WORKLOAD[0].next()


class TokenUser(HttpUser):
    """Trades its API key for a token, again and again (the token endpoint's capacity)."""

    wait_time = constant(0)
    weight = 0  # opt in with `--class-picker` or by naming it

    def on_start(self) -> None:
        """Pick a gateway."""
        _spread(self)

    @task
    def issue(self) -> None:
        """One `POST /v1/token`."""
        self.client.post("/v1/token", headers=_auth(self), name="/v1/token")


class OpenAISseUser(HttpUser):
    """Streams chat completions over `POST /v1/chat/completions` (SSE), one at a time."""

    wait_time = between(0, 0.1)
    weight = 1

    def on_start(self) -> None:
        """Pick a gateway, find the model once."""
        _spread(self)
        self.model = _model(self)

    @task
    def chat(self) -> None:
        """One streamed completion, timed chunk by chunk."""
        request = _next_request()
        body = {
            "model": self.model,
            "messages": list(request.messages),
            "max_tokens": request.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        started, clock = time.time(), time.monotonic()
        first: float | None = None
        times: list[float] = []
        tokens = 0
        error = None
        with self.client.post(
            "/v1/chat/completions", json=body, headers=_auth(self), stream=True,
            name="/v1/chat/completions", catch_response=True,
        ) as response:  # fmt: skip
            if response.status_code != 200:
                error = _http_error_code(response)
                response.failure(error)
            else:
                response.success()
                for line in response.iter_lines():
                    if not line or not line.startswith(b"data: ") or line == b"data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        error = str(chunk["error"].get("code") or chunk["error"].get("type"))
                        break
                    if chunk.get("usage"):
                        tokens = int(chunk["usage"]["completion_tokens"])
                    for choice in chunk.get("choices", []):
                        if choice.get("delta", {}).get("content"):
                            now = time.monotonic()
                            first = first if first is not None else now - clock
                            times.append(now)
        _report(self, "SSE", StreamResult(
            started_at=started, ttft_seconds=first, token_times=times,
            tokens=tokens or len(times), total_seconds=time.monotonic() - clock, error=error,
        ))  # fmt: skip


def _http_error_code(response: Any) -> str:
    try:
        return str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return f"http_{response.status_code}"


class WebsocketUser(HttpUser):
    """API key → token → one `/v1/ws` socket, with `--streams-per-user` streams on it at once."""

    wait_time = between(0, 0.1)
    weight = 1

    def on_start(self) -> None:
        """Pick a gateway, get a token, open the socket, start the frame reader."""
        _spread(self)
        self.model = _model(self)
        self.inboxes: dict[str, Queue[dict[str, Any]]] = {}
        self.ws: websocket.WebSocket | None = None
        self.reader: gevent.Greenlet | None = None
        self._connect()

    def on_stop(self) -> None:
        """Close the socket."""
        if self.reader is not None:
            self.reader.kill()
        if self.ws is not None:
            self.ws.close()

    def _connect(self) -> None:
        response = self.client.post("/v1/token", headers=_auth(self), name="/v1/token")
        response.raise_for_status()
        issued = response.json()
        self.token_expires = float(issued["expires_at"])
        # Replicas share one public URL (the token names it): this user's socket goes to the
        # gateway it was given.
        ws_url = str(self.host).replace("http", "ws", 1) + "/v1/ws"
        self.ws = websocket.create_connection(
            ws_url,
            header=[f"Authorization: Bearer {issued['token']}"],
            timeout=WS_TIMEOUT_SECONDS,
            enable_multithread=True,
        )
        self.reader = gevent.spawn(self._read, self.ws)

    def _read(self, ws: websocket.WebSocket) -> None:
        try:
            while True:
                frame = json.loads(ws.recv())
                inbox = self.inboxes.get(str(frame.get("id")))
                if inbox is not None:
                    inbox.put(frame)
        except (websocket.WebSocketException, OSError, ValueError) as err:
            for inbox in self.inboxes.values():  # every open stream learns the socket is gone
                inbox.put({"type": "error", "code": "connection_lost", "message": str(err)})

    @task
    def generate(self) -> None:
        """`--streams-per-user` streams on the socket at once."""
        if (
            self.ws is None
            or not self.ws.connected
            or (time.time() > self.token_expires - TOKEN_REFRESH_MARGIN_SECONDS)
        ):
            self.on_stop()
            self._connect()
        streams = max(1, int(_option(self, "streams_per_user")))
        gevent.joinall([gevent.spawn(self._stream) for _ in range(streams)])

    def _stream(self) -> None:
        request = _next_request()
        stream_id = uuid.uuid4().hex
        inbox: Queue[dict[str, Any]] = Queue()
        self.inboxes[stream_id] = inbox
        cancel = random.random() < float(_option(self, "cancel_share"))  # noqa: S311
        started, clock = time.time(), time.monotonic()
        first: float | None = None
        times: list[float] = []
        agents: set[str] = set()
        frame: dict[str, Any] = {}
        try:
            if self.ws is None:
                raise websocket.WebSocketConnectionClosedException("no socket")
            self.ws.send(json.dumps({
                "type": "generate", "id": stream_id, "model": self.model,
                "messages": list(request.messages), "max_tokens": request.max_tokens,
            }))  # fmt: skip
            while True:
                frame = inbox.get(timeout=WS_TIMEOUT_SECONDS)
                if frame["type"] == "start":
                    agents.add(str(frame.get("agent")))
                elif frame["type"] == "delta":
                    now = time.monotonic()
                    first = first if first is not None else now - clock
                    times.append(now)
                    if cancel and len(times) == CANCEL_AFTER_TOKENS:
                        self.ws.send(json.dumps({"type": "cancel", "id": stream_id}))
                elif frame["type"] in ("done", "error"):
                    break
        except Empty:
            frame = {"type": "error", "code": "timeout"}
        except (websocket.WebSocketException, OSError):
            frame = {"type": "error", "code": "connection_lost"}
        finally:
            self.inboxes.pop(stream_id, None)
        done = frame["type"] == "done"
        timings = frame.get("timings") or {}
        _report(self, "WS", StreamResult(
            started_at=started, ttft_seconds=first, token_times=times,
            tokens=int(frame["usage"]["completion_tokens"]) if done else len(times),
            total_seconds=time.monotonic() - clock,
            queue_seconds=timings["queue_ms"] / 1000 if "queue_ms" in timings else None,
            resumed=len(agents) > 1, error=None if done else str(frame.get("code")),
            cancelled=done and frame.get("finish_reason") == "cancelled",
        ))  # fmt: skip
