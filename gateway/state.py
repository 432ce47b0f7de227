"""What the gateway's handlers share: `GatewayState`, under the `STATE` app key."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from gateway.agent_link import AgentLink
from gateway.auth import Authenticator
from gateway.dispatch import Dispatcher
from gateway.limits import LimitStore
from gateway.metrics import GatewayMetrics
from gateway.receipts import ReceiptSigner
from gateway.usage import UsageMeter
from spotgate.file_store import FileStore
from spotgate.protocol import GenerateFrame
from spotgate.registry import BatchBacklog, Registry
from spotgate.settings import TOKEN_TTL_MAX_SECONDS, GatewaySettings
from spotgate.tokens import GATEWAY_SUBJECT_PREFIX, KeyRing, issue
from spotgate.wsserver import FrameSocket


def public_url(settings: GatewaySettings) -> str:
    """Where clients reach the gateway: the base of `ws_url` and the chat page's origin."""
    return (settings.public_url or f"http://{settings.host}:{settings.port}").rstrip("/")


def token_issuer(settings: GatewaySettings) -> str:
    """The `iss` of the tokens every replica issues and accepts (default: the public URL)."""
    return (settings.token_issuer or public_url(settings)).rstrip("/")


LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def names_this_gateway(host: str | None, public_url: str) -> bool:
    """Whether a request's `Host` names this gateway: loopback, or its public URL's host.

    A page on another name that resolves here (DNS rebinding) is same-origin to itself, and
    the browser lets it read what the gateway answers; its `Host` is its own name.
    """
    name = urlsplit(f"//{host}").hostname if host else None
    return name is not None and (name in LOOPBACK_NAMES or name == urlsplit(public_url).hostname)


@dataclass
class GatewayState:
    """What the gateway's handlers share."""

    settings: GatewaySettings
    registry: Registry
    ring: KeyRing
    authenticator: Authenticator
    dispatcher: Dispatcher
    session: aiohttp.ClientSession
    gateway_id: str
    public_url: str
    issuer: str  # of the tokens this gateway issues and accepts, the same for every replica
    # What client credentials and per-key limits are judged by (a test moves it ahead).
    clock: Callable[[], float]
    metrics: GatewayMetrics
    # Per-key limits and failed-auth budgets, shared by every replica when a store is set.
    limits: LimitStore
    # Tokens and streams per key, model and minute, not yet added to the `usage` table.
    usage: UsageMeter
    # Receipts for the token ids clients hold, which their resumes bring back.
    receipts: ReceiptSigner
    # The contents of files (`/v1/files`) and of batches' results.
    files: FileStore
    # Uploads read at once (`batch.uploads_per_gateway`): each is held whole while stored.
    uploads: asyncio.Semaphore
    # Downloads streamed at once (`batch.downloads_per_gateway`).
    downloads: asyncio.Semaphore
    uploading: set[str] = field(default_factory=set)  # keys with an upload read here now
    links: dict[str, AgentLink] = field(default_factory=dict)
    sockets: set[FrameSocket] = field(default_factory=set)
    active_streams: int = 0
    shutting_down: bool = False
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    # Set when a batch is created here: this replica's worker looks for it at once.
    batch_created: asyncio.Event = field(default_factory=asyncio.Event)
    # The work left of the batch this replica works, per model: published with its demand.
    batch_backlogs: dict[str, BatchBacklog] = field(default_factory=dict)

    def opened(self, frame: GenerateFrame) -> None:
        """A stream was admitted: counted until `closed`.

        `active_streams`, which a drain waits on, counts it until its limits are settled.
        """
        self.active_streams += 1
        self.idle.clear()
        self.metrics.active_streams.inc()
        if frame.service_tier != "flex":  # interactive streams take turns across replicas
            self.dispatcher.fair_share.opened(frame.base_model, frame.tenant or "")

    def closed(self, frame: GenerateFrame) -> None:
        """The stream admitted with `opened` has ended."""
        self.metrics.active_streams.dec()
        if frame.service_tier != "flex":
            self.dispatcher.fair_share.closed(frame.base_model, frame.tenant or "")

    def agent_token(self) -> tuple[str, float]:
        """A token the gateway presents to agents (refreshed on the link before it expires)."""
        issued = issue(
            self.ring,
            subject=f"{GATEWAY_SUBJECT_PREFIX}{self.gateway_id}",
            issuer=self.issuer,
            now=time.time(),
            ttl_seconds=TOKEN_TTL_MAX_SECONDS,
        )
        return issued.token, float(issued.expires_at)

    def link_for(self, agent_id: str) -> AgentLink | None:
        """The link to an agent in the view, opened lazily."""
        link = self.links.get(agent_id)
        if link is not None and not link.closed:
            return link
        record = self.dispatcher.view.record(agent_id)
        if record is None:
            return None
        link = AgentLink(agent_id, record.url, self.session, self.agent_token)
        self.links[agent_id] = link
        return link

    async def prune_links(self) -> None:
        """Close links to agents that left the registry view and carry no stream."""
        for agent_id, link in list(self.links.items()):
            if self.dispatcher.view.record(agent_id) is None and link.open_streams == 0:
                del self.links[agent_id]
                await link.close()


STATE = web.AppKey("state", GatewayState)
