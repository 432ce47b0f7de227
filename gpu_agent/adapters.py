"""The LoRA adapters an agent serves: loaded on demand, at most a few at once.

A request names an adapter of the agent's model (`model: "<served>:<adapter>"`). The first
stream with it fetches the adapter (a staged `s3://` copy, into the model cache) and loads it
into the engine; later ones find it loaded. At most `max_loaded` are loaded at once: a new
one takes the place of the one least lately used that no stream is running with, and when
every loaded adapter is in use the stream is refused for capacity, so the gateway tries
another agent (or waits). Which adapter to give up is a pure decision (`adapter_to_unload`);
the engine carries it out. Gateways send a stream where they sent its adapter before
(`gateway.router`), where it is most likely loaded still.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from spotgate.model_store import is_s3_uri


class AdapterUnknown(LookupError):
    """The agent serves no adapter of that name."""


class AdaptersBusy(Exception):
    """Every adapter slot holds one that a stream runs with now."""


@dataclass(frozen=True, slots=True)
class Unload:
    """Give up a loaded adapter to make room."""

    name: str


def adapter_to_unload(
    loaded: Iterable[str], in_use: Mapping[str, int], max_loaded: int
) -> Unload | None:
    """What to give up before one more adapter is loaded (`loaded`: least lately used first).

    None: there is room. Raises `AdaptersBusy` when every loaded one is in use.
    """
    loaded = list(loaded)
    if len(loaded) < max_loaded:
        return None
    idle = next((name for name in loaded if not in_use.get(name)), None)
    if idle is None:
        raise AdaptersBusy(f"all {max_loaded} adapter slots are in use; try another agent")
    return Unload(idle)


Fetch = Callable[[str], Awaitable[Path]]
"""Fetches a staged adapter (`s3://…`) and returns its local directory."""


class Adapters:
    """The agent's adapters by name: their sources, which are loaded, which are in use."""

    def __init__(self, sources: Mapping[str, str], max_loaded: int, fetch: Fetch) -> None:
        self.sources = dict(sources)
        self.max_loaded = max_loaded
        self._fetch = fetch
        # vLLM tells adapters apart by a positive integer: fixed by name for the agent's life.
        self._ids = {name: index for index, name in enumerate(sorted(self.sources), start=1)}
        self._loaded: OrderedDict[str, Path] = OrderedDict()  # least lately used first
        self._in_use: Counter[str] = Counter()

    def id_of(self, name: str) -> int:
        """The engine's integer id of the adapter."""
        return self._ids[name]

    def is_loaded(self, name: str) -> bool:
        """Whether the adapter is loaded now."""
        return name in self._loaded

    def to_unload(self, name: str) -> Unload | None:
        """What must go for `name` to be loaded (None: nothing, or it is loaded already)."""
        if name not in self.sources:
            raise AdapterUnknown(self._unknown(name))
        if name in self._loaded:
            return None
        return adapter_to_unload(self._loaded, self._in_use, self.max_loaded)

    async def path(self, name: str) -> Path:
        """The adapter's local directory.

        Where it was loaded from while it is loaded; else its source, a staged one fetched first
        (so a stream with a loaded adapter reads nothing from S3).
        """
        if name in self._loaded:
            return self._loaded[name]
        source = self.sources[name]
        return await self._fetch(source) if is_s3_uri(source) else Path(source)

    def unloaded(self, name: str) -> None:
        """The engine gave the adapter up."""
        self._loaded.pop(name, None)

    def acquired(self, name: str, path: Path) -> None:
        """A stream runs with the adapter, loaded from `path`."""
        self._loaded[name] = path
        self._loaded.move_to_end(name)
        self._in_use[name] += 1

    def released(self, name: str) -> None:
        """A stream that ran with the adapter ended."""
        self._in_use[name] -= 1
        if self._in_use[name] <= 0:
            del self._in_use[name]

    def _unknown(self, name: str) -> str:
        served = ", ".join(sorted(self.sources)) or "none"
        return f"no adapter '{name}' here; the adapters served are: {served}"
