"""API key guessing: the failed-authentication budgets per address and per key id."""

from __future__ import annotations

import inspect
import secrets
import time
from collections.abc import Callable

import aiohttp

from loadtest.hostile.client import Reply, fresh_address
from loadtest.hostile.limits import FAILED_AUTH_PER_CLIENT, FAILED_AUTH_PER_KEY
from loadtest.hostile.report import Row
from loadtest.hostile.stack import HostileStack
from spotgate.apikeys import secret_matches
from spotgate.registry import Registry


async def token_attempt(stack: HostileStack, api_key: str, source: str) -> Reply:
    """`POST /v1/token` with an API key from a given address."""
    connector = aiohttp.TCPConnector(local_addr=(source, 0))
    headers = {"Authorization": f"Bearer {api_key}"}
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post(f"{stack.gateway_url}/v1/token", headers=headers) as reply,
    ):
        return Reply(reply.status, dict(reply.headers), await reply.read())


def wrong_key(key_id: str) -> str:
    """An API key for `key_id` with a random (wrong) secret."""
    return f"sg-{key_id}-{secrets.token_urlsafe(32)}"


async def guess(
    row: Row,
    stack: HostileStack,
    key: Callable[[], str],
    source: Callable[[], str],
    count: int,
    budget_per_minute: int,
) -> None:
    """`count` wrong keys: the budget (and what refilled meanwhile) answer 401, the rest 429."""
    started = time.monotonic()
    replies = [await token_attempt(stack, key(), source()) for _ in range(count)]
    refilled = (time.monotonic() - started) * budget_per_minute / 60
    for reply in replies:
        row.record(reply.outcome(), reply.problem())
    refused = sum(reply.status == 401 for reply in replies)
    limited = sum(reply.status == 429 for reply in replies)
    expected = min(count, budget_per_minute)
    if not expected <= refused <= expected + refilled + 1 or refused + limited != count:
        row.problems.append(
            f"{refused} × 401 and {limited} × 429 for a budget of {budget_per_minute}/min"
        )


async def key_guessing(stack: HostileStack, tries: int) -> list[Row]:
    """Wrong secrets from one address, random key ids, one key id from many addresses."""
    fuzz_id = stack.keys["fuzz"].record.key_id
    one = fresh_address()
    same_id = Row(
        "gateway",
        f"API key: wrong secrets for one real key id, one address "
        f"(budget {FAILED_AUTH_PER_CLIENT}/min per address)",
    )
    await guess(
        same_id, stack, lambda: wrong_key(fuzz_id), lambda: one, tries, FAILED_AUTH_PER_CLIENT
    )
    locked = await token_attempt(stack, wrong_key(fuzz_id), one)
    elsewhere = await token_attempt(stack, wrong_key(fuzz_id), fresh_address())
    in_use = await token_attempt(stack, stack.keys["fuzz"].api_key, fresh_address())
    known = await token_attempt(stack, stack.keys["fuzz"].api_key, one)
    same_id.notes.append(
        f"a guess from that address: {locked.outcome()}, from another: {elsewhere.outcome()}; "
        f"the right key, in use, from that address: {known.outcome()} (no guess)"
    )
    if locked.status != 429 or elsewhere.status != 401:
        same_id.problems.append("the lockout is not per address")
    if in_use.status != 200 or known.status != 200:
        same_id.problems.append("a key in use is refused with its guessers")

    two = fresh_address()
    random_ids = Row("gateway", "API key: random key ids and secrets, one address")
    await guess(
        random_ids,
        stack,
        lambda: wrong_key(secrets.token_hex(6)),
        lambda: two,
        tries,
        FAILED_AUTH_PER_CLIENT,
    )

    victim = stack.keys["victim"]
    many = Row(
        "gateway",
        f"API key: wrong secrets for one key id, a new address each time "
        f"(budget {FAILED_AUTH_PER_KEY}/min per key id)",
    )
    await guess(
        many,
        stack,
        lambda: wrong_key(victim.record.key_id),
        fresh_address,
        FAILED_AUTH_PER_KEY + tries // 2,
        FAILED_AUTH_PER_KEY,
    )
    owner = await token_attempt(stack, victim.api_key, fresh_address())
    other = await token_attempt(stack, stack.keys["bystander"].api_key, fresh_address())
    many.notes.append(
        f"the key's owner meanwhile, not in use just before: {owner.outcome()} (documented); "
        f"another key: {other.outcome()}"
    )
    if owner.status != 429 or other.status != 200:
        many.problems.append("the lockout is not per key id")

    compare = Row("gateway", "API key compare: constant time (code check)")
    checks = {
        "secret_matches uses hmac.compare_digest": "hmac.compare_digest"
        in inspect.getsource(secret_matches),
        "Registry.verify_key compares unknown key ids against a decoy hash": "secret_matches("
        in inspect.getsource(Registry.verify_key),
    }
    for check, holds in checks.items():
        compare.record(f"{check}: {'yes' if holds else 'no'}", None if holds else check)
    return [same_id, random_ids, many, compare]
