"""Services as child processes, each started from its typed settings and nothing else.

Every stack (`spotgate up`, tests, chaos, soak, hostile input, benchmarks) describes its
services as `GatewaySettings`, `AgentSettings` and `PoolSettings` values; the environment a
child reads them back from is derived (`spotgate.settings.settings_env`), so a new setting
is added in one place.
"""

from __future__ import annotations

import socket

from spotgate.process import Child, ChildProcesses, socket_port
from spotgate.settings import AgentSettings, GatewaySettings, PoolSettings, settings_env

ServiceSettings = GatewaySettings | AgentSettings | PoolSettings

SERVICE_MODULES: dict[type[ServiceSettings], str] = {
    GatewaySettings: "gateway",
    AgentSettings: "gpu_agent",
    PoolSettings: "pool_manager",
}
"""The module `python -m` runs for each service's settings."""


def service_command(settings: ServiceSettings) -> tuple[list[str], dict[str, str]]:
    """The `python -m` arguments and the environment that run the service of `settings`."""
    return [SERVICE_MODULES[type(settings)]], settings_env(settings)


def start_service(
    processes: ChildProcesses,
    name: str,
    settings: ServiceSettings,
    sock: socket.socket | None = None,
) -> Child:
    """Run the service `settings` belong to as a child named `name`, configured by them.

    A gateway or an agent given `sock` (bound, e.g. `loopback_socket()`) serves on it.
    """
    if sock is not None:
        if isinstance(settings, PoolSettings):
            raise TypeError("the pool manager takes no socket")
        update = {"port": socket_port(sock), "listen_fd": sock.fileno()}
        settings = settings.model_copy(update=update)
    args, env = service_command(settings)
    return processes.start(name, args, env, (sock,) if sock is not None else ())
