"""An embedded AWS emulator: moto's standalone server on loopback, real HTTP.

`spotgate up` runs one for the local stack and the tests run one per session. Benchmarks
run it as a process of its own (`python -m stack.emulator --port N`), so its request
handling never holds the load generator's interpreter.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moto.core.base_backend import BackendDict, backend_lock
from moto.core.model_instances import model_data
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import BaseWSGIServer, make_server

from spotgate.settings import SharedSettings, emulator_settings
from stack.aws_journal import AwsJournal, Kept, journaled_call

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

EMULATOR_REGION = "us-east-1"


class _OneRequestAtATime:
    """WSGI middleware: moto's backends do not lock, DynamoDB's conditional writes are atomic.

    Without this, two concurrent conditional updates of one item can both succeed on moto's
    threaded server; serializing requests restores DynamoDB's per-item atomicity. After each
    request it drops the model objects moto tracks, so a long-running emulator stays flat.
    """

    def __init__(self, app: WSGIApplication) -> None:
        self.app = app
        self.lock = threading.Lock()  # held for each request, and while the state is emptied
        self.journal: AwsJournal | None = None

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        with self.lock:
            try:
                if self.journal is not None:
                    return journaled_call(self.app, self.journal, environ, start_response)
                return list(self.app(environ, start_response))
            finally:
                _forget_model_instances()


def _forget_model_instances() -> None:
    """Empty moto's lists of every model object it made (for its dashboard; spotgate reads none).

    Until a reset, moto keeps each one, down to the copy of a DynamoDB item that every read
    and write makes: an emulator serving for hours would grow by megabytes a minute.
    """
    for models in model_data.values():
        for model in models.values():
            tracked = getattr(model, "instances_tracked", None)
            if tracked:
                tracked.clear()


class AwsEmulator:
    """moto's standalone server on a loopback port, in a background thread (real HTTP)."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, journal: AwsJournal | None = None
    ) -> None:
        self._host = host
        self._port = port
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._requests = _OneRequestAtATime(DomainDispatcherApplication(create_backend_app))
        self._journal = journal
        self.replayed = 0  # how many of the journal's writes the start made again
        self.url = ""

    def start(self) -> str:
        """Start serving (again on the same port after `stop`); return the endpoint URL.

        With a journal, the writes it holds are made again first, and each kept write is
        added to it from then on.
        """
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        if self._journal is not None and self._requests.journal is None:
            with self._requests.lock:
                self.replayed = self._journal.replay(self._requests.app)
                _forget_model_instances()
            self._requests.journal = self._journal
        self._server = make_server(
            self._host,
            self._port,
            self._requests,
            threaded=True,
            request_handler=MotoRequestHandler,
        )
        self._port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="aws-emulator", daemon=True
        )
        self._thread.start()
        self.url = f"http://{self._host}:{self._port}"
        return self.url

    def stop(self) -> None:
        """Stop serving; emulated state survives a restart in the same process."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def empty(self) -> None:
        """Forget all that is stored but DynamoDB's tables, which stay, emptied of their items.

        What moto's own reset leaves once the tables are made again, at a fraction of the cost:
        making the registry's tables takes thirteen requests and 0.15 s of CPU.
        """
        used: list[Any] = BackendDict._instances  # type: ignore[misc]  # moto's own registry
        with self._requests.lock, backend_lock:
            for backends in used:
                if backends.service_name == "dynamodb":
                    for account in backends.values():
                        for region in account.values():
                            for table in region.tables.values():
                                table.items = defaultdict(dict)
                    continue
                for account in backends.values():
                    account.reset()
                backends.clear()
            used[:] = [kept for kept in used if kept.service_name == "dynamodb"]
            _forget_model_instances()

    def settings(self) -> SharedSettings:
        """Shared settings pointing at this emulator."""
        return emulator_settings(self.url, EMULATOR_REGION)


def main() -> None:
    """Serve on `--host`/`--port` until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(description="spotgate's AWS emulator (moto), standalone")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument(
        "--journal",
        type=Path,
        help="keep keys, usage, files and batches in this file, and start from what it holds",
    )
    args = parser.parse_args()
    journal = AwsJournal(args.journal, Kept.of(SharedSettings())) if args.journal else None
    emulator = AwsEmulator(args.host, args.port, journal)
    print(emulator.start(), flush=True)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _signum, _frame: stop.set())
    stop.wait()
    emulator.stop()


if __name__ == "__main__":
    main()
