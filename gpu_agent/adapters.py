"""The LoRA adapters an agent serves: loaded on demand, at most a few at once.

A request names an adapter of the agent's model (`model: "<served>:<adapter>"`). The first
stream with it fetches the adapter (a staged `s3://` copy, into the model cache) and loads it
into the engine; later ones find it loaded. At most `max_loaded` are loaded at once: a new
one takes the place of one least lately used that no stream is running with, and when none
can go the stream is refused for capacity, so the gateway tries another agent (or waits).
The slots are shared fairly among the tenants (API keys) whose streams loaded them: a tenant
holding its share (the slots over the tenants holding one, itself included) gives up only
its own adapters, so one key cycling through adapters cannot evict another's. Which adapter
to give up is a pure decision (`adapter_to_unload`); the engine carries it out. Gateways
send a stream where they sent its adapter before (`gateway.router`), where it is most likely
loaded still.
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


@dataclass(frozen=True, slots=True)
class Loaded:
    """A loaded adapter, and the tenant whose stream loaded it."""

    name: str
    tenant: str | None


def adapter_to_unload(
    loaded: Iterable[Loaded], in_use: Mapping[str, int], max_loaded: int, tenant: str | None
) -> Unload | None:
    """What to give up before `tenant` loads one more (`loaded`: least lately used first).

    None: there is room. A tenant below its share of the slots takes the least lately used
    idle adapter of the tenant holding the most (more than it does); otherwise, or where none
    is idle, it gives up its own least lately used idle one. Raises `AdaptersBusy` when there
    is none of those.
    """
    loaded = list(loaded)
    if len(loaded) < max_loaded:
        return None
    idle = [adapter for adapter in loaded if not in_use.get(adapter.name)]
    held = Counter(adapter.tenant for adapter in loaded)
    share = max(1, max_loaded // len(held.keys() | {tenant}))
    if held[tenant] < share:
        richer = [adapter for adapter in idle if held[adapter.tenant] > held[tenant]]
        most = max((held[adapter.tenant] for adapter in richer), default=0)
        for adapter in richer:
            if held[adapter.tenant] == most:
                return Unload(adapter.name)
    for adapter in idle:
        if adapter.tenant == tenant:
            return Unload(adapter.name)
    raise AdaptersBusy(
        f"no adapter slot can be freed for this key here ({max_loaded} slots, shared fairly "
        "among the keys using them); try another agent"
    )


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
        # Each with where it was loaded from and whose stream loaded it; least lately used first.
        self._loaded: OrderedDict[str, tuple[Path, str | None]] = OrderedDict()
        self._in_use: Counter[str] = Counter()

    def id_of(self, name: str) -> int:
        """The engine's integer id of the adapter."""
        return self._ids[name]

    def is_loaded(self, name: str) -> bool:
        """Whether the adapter is loaded now."""
        return name in self._loaded

    def to_unload(self, name: str, tenant: str | None) -> Unload | None:
        """What must go for `tenant` to load `name` (None: nothing, or it is loaded already)."""
        if name not in self.sources:
            raise AdapterUnknown(self._unknown(name))
        if name in self._loaded:
            return None
        loaded = [Loaded(loaded_name, owner) for loaded_name, (_, owner) in self._loaded.items()]
        return adapter_to_unload(loaded, self._in_use, self.max_loaded, tenant)

    async def path(self, name: str) -> Path:
        """The adapter's local directory.

        Where it was loaded from while it is loaded; else its source, a staged one fetched first
        (so a stream with a loaded adapter reads nothing from S3).
        """
        if name in self._loaded:
            return self._loaded[name][0]
        source = self.sources[name]
        return await self._fetch(source) if is_s3_uri(source) else Path(source)

    def unloaded(self, name: str) -> None:
        """The engine gave the adapter up."""
        self._loaded.pop(name, None)

    def acquired(self, name: str, path: Path, tenant: str | None) -> None:
        """A stream of `tenant` runs with the adapter, loaded from `path` (by it, if just now)."""
        _path, owner = self._loaded.get(name, (path, tenant))  # the loader's, while it stays
        self._loaded[name] = (path, owner)
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
