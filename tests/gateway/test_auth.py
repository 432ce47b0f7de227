from __future__ import annotations

import asyncio

import pytest

from gateway.auth import Authenticator
from spotgate.emulator import AwsEmulator
from spotgate.registry import ApiKeyRecord, Registry
from spotgate.tokens import KeyRing, SigningKey
from spotgate.wsserver import AuthRefused


class CountingRegistry(Registry):
    """The real registry, counting key reads."""

    reads = 0

    async def verify_key(self, api_key: str) -> ApiKeyRecord:
        self.reads += 1
        return await super().verify_key(api_key)


async def test_a_burst_of_new_connections_shares_one_key_read(aws: AwsEmulator) -> None:
    async with CountingRegistry.open(aws.settings()) as registry:
        await registry.create_tables()
        created = await registry.create_key("burst")
        auth = Authenticator(registry, KeyRing([SigningKey.generate()]), "http://gw", 5.0, 64)

        principals = await asyncio.gather(*(auth.authenticate(created.api_key) for _ in range(50)))

        assert {p.key_id for p in principals} == {created.record.key_id}
        assert registry.reads == 1
        with pytest.raises(AuthRefused, match="invalid API key"):
            await auth.authenticate(created.api_key[:-2] + "zz")
        assert registry.reads == 2
