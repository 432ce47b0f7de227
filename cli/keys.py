"""`spotgate keys`: create, list and disable API keys, and read what they used."""

from __future__ import annotations

import argparse
import math
import sys
import time

from cli.args import (
    CommandError,
    Commands,
    OneLineParser,
    positive_int,
    run_async,
    shared_settings,
)
from spotgate.registry import (
    MAX_KEY_WEIGHT,
    ApiKeyNotFound,
    ApiKeyRecord,
    Registry,
    UsageCounts,
)
from spotgate.tenancy import valid_tenant_name

SINCE_UNIT_SECONDS = {"m": 60, "h": 3600, "d": 86400}
USAGE_COLUMNS = (
    "key_id",
    "name",
    "model",
    "streams",
    "prompt_tokens",
    "completion_tokens",
    "flex_tokens",
)


def tenant_name(text: str) -> str:
    """An argument type: a tenant's name (`spotgate.tenancy.valid_tenant_name`)."""
    if not valid_tenant_name(text):
        raise argparse.ArgumentTypeError(
            "1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return text


def key_weight(text: str) -> float:
    """An argument type: a key's weight, above 0 and at most `MAX_KEY_WEIGHT`."""
    try:
        weight = float(text)
    except ValueError:
        weight = math.nan
    if not 0 < weight <= MAX_KEY_WEIGHT:
        raise argparse.ArgumentTypeError(f"a number above 0 and at most {MAX_KEY_WEIGHT:g}")
    return weight


def _describe_key(record: ApiKeyRecord) -> str:
    limits = ", ".join(
        f"{label}={value}"
        for label, value in (
            ("rpm", record.rpm),
            ("tpm", record.tpm),
            ("max_tokens", record.max_tokens),
            ("max_streams", record.max_streams),
            ("tenant", record.tenant),
            ("weight", f"{record.weight:g}" if record.weight != 1 else None),
        )
        if value is not None
    )
    models = ",".join(sorted(record.models)) or "all models"
    state = "disabled" if record.disabled else "enabled"
    return f"{record.key_id}  {record.name}  {state}  {models}  {limits or 'no limits'}"


async def _keys_create(args: argparse.Namespace) -> int:
    async with Registry.open(shared_settings()) as registry:
        created = await registry.create_key(
            args.name,
            rpm=args.rpm,
            tpm=args.tpm,
            max_tokens=args.max_tokens,
            models=[model for model in (args.models or "").split(",") if model],
            max_streams=args.max_streams,
            tenant=args.tenant,
            weight=args.weight,
        )
    print(created.api_key)
    print(
        f"created key {created.record.key_id} ({created.record.name}); "
        "this is the only time the full key is shown",
        file=sys.stderr,
    )
    return 0


async def _keys_list(_args: argparse.Namespace) -> int:
    async with Registry.open(shared_settings()) as registry:
        records = await registry.list_keys()
    for record in records:
        print(_describe_key(record))
    return 0


async def _keys_disable(args: argparse.Namespace) -> int:
    async with Registry.open(shared_settings()) as registry:
        try:
            await registry.disable_key(args.key_id)
        except ApiKeyNotFound as err:
            raise CommandError(str(err)) from err
    print(f"disabled key {args.key_id}")
    return 0


def duration(text: str) -> float:
    """Seconds in `90m`, `24h` or `7d`."""
    unit = SINCE_UNIT_SECONDS.get(text[-1:])
    try:
        amount = float(text[:-1])
    except ValueError:
        amount = 0.0
    if unit is None or not amount > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90m, 24h or 7d")
    return amount * unit


async def _keys_usage(args: argparse.Namespace) -> int:
    async with Registry.open(shared_settings()) as registry:
        rows = await registry.read_usage(args.key_id, time.time() - args.since)
        names = {record.key_id: record.name for record in await registry.list_keys()}
    totals: dict[tuple[str, str], UsageCounts] = {}
    for row in rows:
        totals[(row.key_id, row.model)] = totals.get((row.key_id, row.model), UsageCounts()) + (
            row.counts
        )
    print("  ".join(USAGE_COLUMNS))
    for (key_id, model), counts in sorted(totals.items()):
        print(
            f"{key_id}  {names.get(key_id, '?')}  {model}  {counts.streams}  "
            f"{counts.prompt_tokens}  {counts.completion_tokens}  {counts.flex_tokens}"
        )
    return 0


def setup_keys(commands: Commands) -> None:
    """Add `keys create|list|disable|usage`."""
    keys = commands.add_parser("keys", help="manage API keys")
    key_commands = keys.add_subparsers(
        dest="keys_command", required=True, parser_class=OneLineParser
    )
    create = key_commands.add_parser("create", help="create a key and print it once")
    create.add_argument("--name", required=True)
    create.add_argument("--rpm", type=positive_int, help="requests per minute")
    create.add_argument("--tpm", type=positive_int, help="tokens per minute")
    create.add_argument("--max-tokens", type=positive_int, help="max tokens per request")
    create.add_argument("--models", help="comma-separated models this key may use (default all)")
    create.add_argument(
        "--max-streams",
        type=positive_int,
        help="concurrent streams over every replica (default: the gateways' setting)",
    )
    create.add_argument(
        "--tenant",
        type=tenant_name,
        help="share routing and the prefix cache with the other keys of this tenant "
        "(default: the key is a tenant of its own)",
    )
    create.add_argument(
        "--weight",
        type=key_weight,
        default=1.0,
        help="its tenant's share of a full model's queue against other tenants' (default 1; "
        "2: twice the tokens in each round)",
    )
    create.set_defaults(handler=run_async(_keys_create))
    key_commands.add_parser("list", help="list keys").set_defaults(handler=run_async(_keys_list))
    disable = key_commands.add_parser("disable", help="disable a key at once")
    disable.add_argument("key_id")
    disable.set_defaults(handler=run_async(_keys_disable))
    usage = key_commands.add_parser(
        "usage", help="streams and tokens per key and model (every key, or one)"
    )
    usage.add_argument("key_id", nargs="?")
    usage.add_argument(
        "--since", type=duration, default=duration("24h"), help="how far back: 90m, 24h, 7d"
    )
    usage.set_defaults(handler=run_async(_keys_usage))
