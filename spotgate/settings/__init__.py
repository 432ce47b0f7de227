"""Settings for every spotgate service, read from the environment (ARCHITECTURE.md).

Prefixes: ``SPOTGATE_`` for what all services share, ``SPOTGATE_GATEWAY_``,
``SPOTGATE_AGENT_`` and ``SPOTGATE_POOL_`` for each service; nested fields use ``__``
(``SPOTGATE_AWS__ENDPOINT_URL``, ``SPOTGATE_GATEWAY_LIMITS__MAX_FRAME_BYTES``).
Every value is validated at start-up so a bad deployment fails with one clear line.
One module per service (`gateway`, `agent`, `pool`), what they share (`shared`) and how
settings travel to a child (`environment`); every name is importable from here.
"""

from __future__ import annotations

from spotgate.settings.agent import (
    AgentSettings,
    ModelServing,
    SyntheticSettings,
    VllmSettings,
    advertised_url,
    model_store_aws,
)
from spotgate.settings.environment import describe_validation_error, settings_env
from spotgate.settings.gateway import (
    LOOPBACK_HOSTS,
    BatchSettings,
    GatewaySettings,
    LimitStoreSettings,
    QueueSettings,
    RoutingSettings,
    TokenSettings,
)
from spotgate.settings.pool import (
    DEFAULT_AGENT_CAPACITY,
    LOCAL_INSTANCE_TYPE,
    POOL_DEFAULTS,
    Ec2PoolSettings,
    LocalPoolSettings,
    Placement,
    PoolModel,
    PoolSettings,
    local_placements,
)
from spotgate.settings.shared import (
    ADAPTER_SEPARATOR,
    DEFAULT_MAX_FRAME_BYTES,
    EMULATOR_CREDENTIAL,
    MAX_REQUEST_BYTES,
    TOKEN_TTL_MAX_SECONDS,
    AwsSettings,
    EngineKind,
    Lifecycle,
    LogFormat,
    LogLevel,
    NonNegativeInt,
    RegistryTimings,
    ServedName,
    SharedSettings,
    SocketLimits,
    TableNames,
    emulator_settings,
)

__all__ = [
    "ADAPTER_SEPARATOR",
    "DEFAULT_AGENT_CAPACITY",
    "DEFAULT_MAX_FRAME_BYTES",
    "EMULATOR_CREDENTIAL",
    "LOCAL_INSTANCE_TYPE",
    "LOOPBACK_HOSTS",
    "MAX_REQUEST_BYTES",
    "POOL_DEFAULTS",
    "TOKEN_TTL_MAX_SECONDS",
    "AgentSettings",
    "AwsSettings",
    "BatchSettings",
    "Ec2PoolSettings",
    "EngineKind",
    "GatewaySettings",
    "Lifecycle",
    "LimitStoreSettings",
    "LocalPoolSettings",
    "LogFormat",
    "LogLevel",
    "ModelServing",
    "NonNegativeInt",
    "Placement",
    "PoolModel",
    "PoolSettings",
    "QueueSettings",
    "RegistryTimings",
    "RoutingSettings",
    "ServedName",
    "SharedSettings",
    "SocketLimits",
    "SyntheticSettings",
    "TableNames",
    "TokenSettings",
    "VllmSettings",
    "advertised_url",
    "describe_validation_error",
    "emulator_settings",
    "local_placements",
    "model_store_aws",
    "settings_env",
]
