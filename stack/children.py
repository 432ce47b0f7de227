"""Services as child processes, each started from its typed settings and nothing else.

Every stack (`spotgate up`, tests, chaos, soak, hostile input, benchmarks) describes its
services as `GatewaySettings`, `AgentSettings` and `PoolSettings` values; the environment a
child reads them back from is derived (`spotgate.settings.settings_env`), so a new setting
is added in one place.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from spotgate.process import Child, ChildProcesses, loopback_socket, socket_port
from spotgate.settings import AgentSettings, GatewaySettings, PoolSettings, settings_env

ServiceSettings = GatewaySettings | AgentSettings | PoolSettings

SERVICE_MODULES: dict[type[ServiceSettings], str] = {
    GatewaySettings: "gateway",
    AgentSettings: "gpu_agent",
    PoolSettings: "pool_manager",
}
"""The module `python -m` runs for each service's settings."""


@dataclass(frozen=True, slots=True)
class GatewaySockets:
    """A gateway's two listening sockets, bound by its parent: traffic, and operations.

    Operations (`/readyz`, `/metrics`) are a port of their own, which no load balancer
    forwards; a gateway is always handed both, so two on one machine never meet on a port.
    """

    traffic: socket.socket
    ops: socket.socket
    # Its URLs, read when bound: a parent that closes its copies still knows them.
    url: str = field(init=False)
    ops_url: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", f"http://127.0.0.1:{socket_port(self.traffic)}")
        object.__setattr__(self, "ops_url", f"http://127.0.0.1:{socket_port(self.ops)}")

    @classmethod
    def bind(cls, port: int = 0, ops_port: int = 0) -> GatewaySockets:
        """Both on loopback (0: a port the kernel picks); a failure leaves neither open."""
        traffic = loopback_socket(port)
        try:
            ops = loopback_socket(ops_port)
        except BaseException:
            traffic.close()
            raise
        return cls(traffic, ops)

    def close(self) -> None:
        """Close this process's copies (a child handed them keeps its own)."""
        self.traffic.close()
        self.ops.close()


def service_command(settings: ServiceSettings) -> tuple[list[str], dict[str, str]]:
    """The `python -m` arguments and the environment that run the service of `settings`."""
    return [SERVICE_MODULES[type(settings)]], settings_env(settings)


def start_service(
    processes: ChildProcesses,
    name: str,
    settings: ServiceSettings,
    sock: socket.socket | GatewaySockets | None = None,
    env: Mapping[str, str] | None = None,
) -> Child:
    """Run the service `settings` belong to as a child named `name`, configured by them.

    An agent given `sock` (bound, e.g. `loopback_socket()`) serves on it; a gateway is given
    `GatewaySockets` and serves traffic and operations on them. `env`: what is not a setting
    (an engine's own variables, such as vLLM's CPU binding).
    """
    handed: tuple[socket.socket, ...] = ()
    if isinstance(sock, GatewaySockets):
        if not isinstance(settings, GatewaySettings):
            raise TypeError("only a gateway takes GatewaySockets")
        handed = (sock.traffic, sock.ops)
        update = {
            "port": socket_port(sock.traffic),
            "listen_fd": sock.traffic.fileno(),
            "ops_port": socket_port(sock.ops),
            "ops_listen_fd": sock.ops.fileno(),
        }
        settings = settings.model_copy(update=update)
    elif sock is not None:
        if not isinstance(settings, AgentSettings):
            raise TypeError("an agent takes a socket; a gateway takes GatewaySockets")
        handed = (sock,)
        settings = settings.model_copy(
            update={"port": socket_port(sock), "listen_fd": sock.fileno()}
        )
    args, service_env = service_command(settings)
    return processes.start(name, args, {**service_env, **(env or {})}, handed)
