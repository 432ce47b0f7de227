"""An IMDSv2 emulator: instance identity, spot interruption notices and rebalance events.

Serves the paths the agent reads, with IMDSv2's token handshake enforced, plus control
routes under `/_emulator/` to issue a notice, as the local pool and the tests do:

    POST /_emulator/spot-notice   {"in_seconds": 120, "action": "terminate"}
    POST /_emulator/rebalance
    DELETE /_emulator/notices
"""

from __future__ import annotations

import argparse
import secrets
import socket
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from aiohttp import web

from gpu_agent.imds import (
    IDENTITY_DOCUMENT_PATH,
    PARTITION_PATH,
    REBALANCE_PATH,
    SPOT_ACTION_PATH,
    InstanceIdentity,
)
from spotgate.regions import zone_region

MAX_TOKEN_TTL_SECONDS = 21600


@dataclass
class EmulatedInstance:
    """What the emulator reports, and the notices it was told to issue."""

    identity: InstanceIdentity
    local_ipv4: str = "127.0.0.1"  # the address the boot script advertises the agent on
    spot_action: tuple[str, float] | None = None
    rebalance_at: float | None = None
    tokens: set[str] = field(default_factory=set)
    started_at: float = field(default_factory=time.time)  # the launch, unless told otherwise


EMULATED_INSTANCE = web.AppKey("emulated_instance", EmulatedInstance)


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _put_token(request: web.Request) -> web.Response:
    ttl = request.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
    if not ttl.isdigit() or not 1 <= int(ttl) <= MAX_TOKEN_TTL_SECONDS:
        return web.Response(status=400, text="missing or invalid token TTL")
    token = secrets.token_urlsafe(24)
    request.app[EMULATED_INSTANCE].tokens.add(token)
    return web.Response(text=token)


async def _get_metadata(request: web.Request) -> web.Response:
    instance = request.app[EMULATED_INSTANCE]
    if request.headers.get("X-aws-ec2-metadata-token") not in instance.tokens:
        return web.Response(status=401)
    identity = instance.identity
    path = request.path
    values = {
        "/latest/meta-data/instance-id": identity.instance_id,
        "/latest/meta-data/instance-type": identity.instance_type,
        "/latest/meta-data/placement/availability-zone": identity.zone,
        "/latest/meta-data/instance-life-cycle": identity.lifecycle,
        "/latest/meta-data/local-ipv4": instance.local_ipv4,
        PARTITION_PATH: identity.partition,
    }
    if path in values:
        return web.Response(text=values[path])
    if path == IDENTITY_DOCUMENT_PATH:  # the fields read of EC2's document
        return web.json_response(
            {
                "accountId": identity.account,
                "region": identity.region,
                "instanceId": identity.instance_id,
                "instanceType": identity.instance_type,
                "availabilityZone": identity.zone,
                "pendingTime": _iso(identity.launched_at or instance.started_at),
            }
        )
    if path == SPOT_ACTION_PATH and instance.spot_action is not None:
        action, deadline = instance.spot_action
        return web.json_response({"action": action, "time": _iso(deadline)})
    if path == REBALANCE_PATH and instance.rebalance_at is not None:
        return web.json_response({"noticeTime": _iso(instance.rebalance_at)})
    return web.Response(status=404)


async def _issue_spot_notice(request: web.Request) -> web.Response:
    body = await request.json() if request.can_read_body else {}
    in_seconds = float(body.get("in_seconds", 120))
    action = str(body.get("action", "terminate"))
    deadline = time.time() + in_seconds
    request.app[EMULATED_INSTANCE].spot_action = (action, deadline)
    return web.json_response({"action": action, "deadline": deadline})


async def _issue_rebalance(request: web.Request) -> web.Response:
    request.app[EMULATED_INSTANCE].rebalance_at = time.time()
    return web.json_response({"rebalance_at": request.app[EMULATED_INSTANCE].rebalance_at})


async def _clear_notices(request: web.Request) -> web.Response:
    instance = request.app[EMULATED_INSTANCE]
    instance.spot_action = None
    instance.rebalance_at = None
    return web.Response(status=204)


def create_app(identity: InstanceIdentity, local_ipv4: str = "127.0.0.1") -> web.Application:
    """The emulator as an aiohttp application."""
    app = web.Application()
    app[EMULATED_INSTANCE] = EmulatedInstance(identity, local_ipv4)
    app.router.add_put("/latest/api/token", _put_token)
    app.router.add_get("/latest/{path:.*}", _get_metadata)
    app.router.add_post("/_emulator/spot-notice", _issue_spot_notice)
    app.router.add_post("/_emulator/rebalance", _issue_rebalance)
    app.router.add_delete("/_emulator/notices", _clear_notices)
    return app


def main() -> None:
    """Run an emulator: `python -m gpu_agent.imds_emulator --port 1338 --instance-id i-…`."""
    parser = argparse.ArgumentParser(description="IMDSv2 emulator")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=1338)
    parser.add_argument("--listen-fd", type=int, help="serve on this inherited socket instead")
    parser.add_argument("--instance-id", default="i-local")
    parser.add_argument("--instance-type", default="local")
    parser.add_argument("--zone", default="local")
    parser.add_argument("--lifecycle", default="spot")
    parser.add_argument("--local-ipv4", default="127.0.0.1", help="the instance's private IP")
    parser.add_argument(
        "--launched-at", type=float, default=0.0, help="epoch seconds (default: its own start)"
    )
    args = parser.parse_args()
    identity = InstanceIdentity(
        args.instance_id,
        args.instance_type,
        args.zone,
        args.lifecycle,
        region=zone_region(args.zone),
        launched_at=args.launched_at,
    )
    app = create_app(identity, args.local_ipv4)
    if args.listen_fd is not None:
        web.run_app(app, sock=socket.socket(fileno=args.listen_fd), print=None)
    else:
        web.run_app(app, host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
