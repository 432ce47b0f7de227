"""`spotgate pool`: run the pool manager, see the pool, fix its size, inject interruptions."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

from cli.args import (
    CommandError,
    Commands,
    OneLineParser,
    non_negative_float,
    non_negative_int,
    run_async,
    shared_settings,
)
from spotgate.registry import BOOT_PHASES, AgentRecord, Registry
from stack.local import find_local_stack


def _pool_run(_args: argparse.Namespace) -> int:
    from pool_manager.service import main

    return main()


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _print_table(rows: Sequence[Sequence[str]]) -> None:
    """Rows in aligned columns, the first row the header."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


async def _pool_status(_args: argparse.Namespace) -> int:
    async with Registry.open(shared_settings()) as registry:
        agents = await registry.list_agents(include_expired=True)
        demand = await registry.read_demand()
        fixed = await registry.read_pool_targets()
    now = time.time()
    rows = [("AGENT", "MODEL", "STATE", "LIFECYCLE", "TYPE", "REGION", "ZONE", "LOAD", "AGE")]
    for agent in sorted(agents, key=lambda a: (a.model, a.agent_id)):
        state = agent.shown_state if agent.is_live(now) else f"{agent.shown_state} (stale)"
        rows.append(
            (agent.agent_id, agent.model, state, agent.lifecycle, agent.instance_type,
             agent.region, agent.zone, f"{agent.active}/{agent.capacity}",
             _age(now - agent.started_at))
        )  # fmt: skip
    _print_table(rows)
    _print_failures(agents)
    for model in sorted(set(demand) | set(fixed)):
        wanted = demand.get(model)
        line = f"{model}: {wanted.pending if wanted else 0} queued, "
        line += f"{wanted.active if wanted else 0} running"
        if model in fixed:
            line += f"; agent count fixed at {fixed[model]} (spotgate pool scale)"
        print(line)
    return 0


async def _pool_boots(args: argparse.Namespace) -> int:
    async with Registry.open(shared_settings()) as registry:
        agents = await registry.list_agents(include_expired=True)
    booted = [
        (agent, phases)
        for agent in sorted(agents, key=lambda a: a.boot.ready)
        if "ready" in (phases := agent.boot.elapsed_seconds())
    ]
    if args.json:
        # A cold boot's `cold_start_seconds`, a warm one's `warm_start_seconds`: a reader of
        # cold starts never takes a warm start for one.
        timed = [
            {"agent_id": agent.agent_id, "model": agent.model,
             "instance_type": agent.instance_type, "region": agent.region,
             "zone": agent.zone,
             "kind": agent.boot_kind, "phases_seconds": phases,
             f"{agent.boot_kind}_start_seconds": phases["ready"]}
            for agent, phases in booted
        ]  # fmt: skip
        print(json.dumps(timed, indent=2))
        return 0
    phase_names = BOOT_PHASES[1:]
    rows = [("AGENT", "KIND", "TYPE", "REGION", "ZONE", *(f"{p.upper()} s" for p in phase_names))]
    for agent, phases in booted:
        rows.append(
            (agent.agent_id, agent.boot_kind, agent.instance_type, agent.region, agent.zone,
             *(f"{phases[phase]:.1f}" if phase in phases else "-" for phase in phase_names))
        )  # fmt: skip
    _print_table(rows)
    _print_failures(agents)
    return 0


def _print_failures(agents: Sequence[AgentRecord]) -> None:
    """One line for each agent that could not start, saying why."""
    for agent in sorted(agents, key=lambda a: a.started_at):
        if agent.failure is not None:
            print(f"{agent.agent_id} could not start: {agent.failure}")


async def _pool_scale(args: argparse.Namespace) -> int:
    count = None if args.count == "auto" else int(args.count)
    async with Registry.open(shared_settings()) as registry:
        await registry.set_pool_target(args.model, count)
    if count is None:
        print(f"{args.model}: agent count follows demand again")
    else:
        print(f"{args.model}: agent count fixed at {count}")
    return 0


async def _pool_interrupt(args: argparse.Namespace) -> int:
    from pool_manager.events import interruption_warning
    from spotgate.registry import aws_session
    from spotgate.settings import PoolSettings

    stack = find_local_stack(Path.cwd())
    queue_url = stack.interruption_queue_url if stack else PoolSettings().interruption_queue_url
    if not queue_url:
        raise CommandError(
            "no interruption queue: run it where `spotgate up` runs, or set "
            "SPOTGATE_POOL_INTERRUPTION_QUEUE_URL (on AWS, AWS FIS sends real interruptions)"
        )
    shared = shared_settings()
    async with Registry.open(shared) as registry:
        agent = await registry.get_agent(args.agent_id)
    if agent is None:
        raise CommandError(f"agent {args.agent_id} is not registered")
    body = interruption_warning(args.agent_id, time.time() + args.in_seconds, shared.aws.region)
    async with aws_session(shared.aws).client("sqs", endpoint_url=shared.aws.endpoint_url) as sqs:
        await sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps(body))
    print(f"interruption sent: {args.agent_id} goes in {args.in_seconds:.0f} s")
    return 0


def _pool_count(text: str) -> str:
    if text == "auto":
        return text
    return str(non_negative_int(text))


def setup_pool(commands: Commands) -> None:
    """Add `pool run|status|boots|scale|interrupt`."""
    pool = commands.add_parser("pool", help="inspect and steer the GPU pool")
    pool_commands = pool.add_subparsers(
        dest="pool_command", required=True, parser_class=OneLineParser
    )
    pool_commands.add_parser("run", help="run the pool manager from the environment").set_defaults(
        handler=_pool_run
    )
    pool_commands.add_parser(
        "status", help="agents by state, lifecycle, type, zone, load"
    ).set_defaults(handler=run_async(_pool_status))
    boots = pool_commands.add_parser(
        "boots",
        help="each agent's boot, cold (launch) or warm (start from the warm pool): seconds "
        "from its launch or start to the end of each phase",
    )
    boots.add_argument("--json", action="store_true", help="JSON, as `spotgate sim` reads it")
    boots.set_defaults(handler=run_async(_pool_boots))
    scale = pool_commands.add_parser("scale", help="fix a model's agent count, or `auto`")
    scale.add_argument("model")
    scale.add_argument("count", type=_pool_count, help="agents, or `auto` to follow demand")
    scale.set_defaults(handler=run_async(_pool_scale))
    interrupt = pool_commands.add_parser("interrupt", help="inject a spot interruption")
    interrupt.add_argument("agent_id")
    interrupt.add_argument("--in", dest="in_seconds", type=non_negative_float, default=120.0)
    interrupt.set_defaults(handler=run_async(_pool_interrupt))
