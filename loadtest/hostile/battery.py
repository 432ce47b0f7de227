"""Every class of hostile input against one stack, one row each."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from loadtest.hostile.client import ws_url
from loadtest.hostile.http_requests import fuzz_bodies, fuzz_headers
from loadtest.hostile.jwt_attacks import jwt_attacks, replay_after_rotation
from loadtest.hostile.key_guessing import key_guessing
from loadtest.hostile.logs import log_rows
from loadtest.hostile.origins import dns_rebinding, origins
from loadtest.hostile.private_paths import private_paths
from loadtest.hostile.prompt_size import oversized_prompts
from loadtest.hostile.report import Row
from loadtest.hostile.resume_charges import invented_resumes
from loadtest.hostile.revocation import disabled_key_on_an_open_socket, streams_ended_early
from loadtest.hostile.rogue_agent import rogue_agent_rows
from loadtest.hostile.slow_clients import MAX_OTHER_CLIENT_SECONDS, never_reads, slowloris
from loadtest.hostile.stack import HostileStack
from loadtest.hostile.tenant_oracle import tenant_oracle
from loadtest.hostile.ws_frames import fuzz_websocket


async def run_battery(
    examples: int,
    slow_connections: int,
    guesses: int,
    keep_logs: Path | None = None,
    other_client_seconds_max: float | None = MAX_OTHER_CLIENT_SECONDS,
) -> list[Row]:
    """Every class of hostile input against one stack, then the logs (copied to `keep_logs`).

    `other_client_seconds_max`: the longest a normal client's chat may take while slow senders
    and a client that never reads press on the same server (None: each must be served, in any
    time).
    """
    with tempfile.TemporaryDirectory(prefix="spotgate-hostile-") as scratch:
        async with HostileStack(Path(scratch)) as stack:
            gateway, agent = stack.gateway_url, stack.agent_url
            fuzz_key = stack.keys["fuzz"].api_key
            agent_token = await stack.token("fuzz")
            rows = [
                await asyncio.to_thread(
                    fuzz_websocket, "gateway", ws_url(gateway), fuzz_key, examples
                ),
                await asyncio.to_thread(
                    fuzz_websocket, "agent", ws_url(agent), agent_token, examples
                ),
                await asyncio.to_thread(
                    fuzz_bodies,
                    "gateway",
                    gateway,
                    ["/v1/chat/completions", "/v1/completions", "/v1/token"],
                    fuzz_key,
                    examples,
                ),
                await asyncio.to_thread(
                    fuzz_bodies, "agent", agent, ["/v1/chat/completions"], agent_token, examples
                ),
                await asyncio.to_thread(
                    fuzz_headers, "gateway", gateway, "/v1/chat/completions", fuzz_key, examples
                ),
                await asyncio.to_thread(
                    fuzz_headers, "agent", agent, "/v1/chat/completions", agent_token, examples
                ),
            ]
            rows += await jwt_attacks(stack)
            rows += await key_guessing(stack, guesses)
            rows.append(await origins(stack))
            rows.append(await dns_rebinding(stack))
            rows.append(await private_paths(stack))
            bound = other_client_seconds_max
            rows.append(await slowloris("gateway", gateway, fuzz_key, slow_connections, bound))
            rows.append(await slowloris("agent", agent, agent_token, slow_connections, bound))
            reader_key = stack.keys["reader"].api_key
            gateway_pid, agent_pid = stack.pid(stack.gateway), stack.pid(stack.agent)
            rows.append(await never_reads("gateway", gateway, reader_key, gateway_pid, bound))
            reader_token = await stack.token("reader")
            rows.append(await never_reads("agent", agent, reader_token, agent_pid, bound))
            rows.append(await disabled_key_on_an_open_socket(stack))
            rows.append(await streams_ended_early(stack))
            rows.append(await invented_resumes(stack))
            rows.append(await rogue_agent_rows(stack))
            rows.append(await tenant_oracle(stack))
            rows += await oversized_prompts(stack)
            rows.append(await replay_after_rotation(stack))
            rows += log_rows(stack)
        if keep_logs is not None:
            shutil.copytree(stack.log_dir, keep_logs, dirs_exist_ok=True)
    return rows
