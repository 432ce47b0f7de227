from __future__ import annotations

import asyncio

import pytest

from gpu_agent.engine import Engine
from gpu_agent.imds import ImdsClient, ImdsUnavailable, InstanceIdentity
from gpu_agent.runtime import AgentRuntime
from spotgate.registry import Registry
from spotgate.settings import AgentSettings
from spotgate.tokens import KeyRing
from stack.emulator import AwsEmulator
from tests.support.agents import ISSUER


async def test_a_bring_up_cancelled_as_its_identity_comes_goes_no_further(
    aws: AwsEmulator, registry: Registry, ring: KeyRing
) -> None:
    # An agent whose port is taken cancels its bring-up as soon as it starts, often in the step
    # its identity lookup ends. asyncio.wait_for on Python 3.11 returned the lookup's result and
    # dropped that cancel: the bring-up went on to wait for a socket that never listened, and
    # the agent hung instead of exiting saying why.
    class AnswersAsItIsCancelled(ImdsClient):
        def __init__(self) -> None:
            pass

        async def identity(self) -> InstanceIdentity:
            answer: asyncio.Future[InstanceIdentity] = asyncio.get_running_loop().create_future()

            def answer_and_cancel() -> None:  # in one step of the loop, as a race gives them
                answer.set_exception(ImdsUnavailable("no IMDS here"))
                bring_up.cancel()

            asyncio.get_running_loop().call_soon(answer_and_cancel)
            return await answer

    loaded: list[AgentSettings] = []

    async def loader(settings: AgentSettings) -> Engine:
        loaded.append(settings)
        raise AssertionError("the engine was loaded after the cancel")

    settings = AgentSettings(
        shared=aws.settings(),
        engine="synthetic",
        agent_id="cancelled",
        pinned_public_key=ring.signing_key.verify_key.to_pem(),
        token_issuer=ISSUER,
    )
    runtime = AgentRuntime(
        settings=settings,
        registry=registry,
        url="http://127.0.0.1:9",
        imds=AnswersAsItIsCancelled(),
    )
    bring_up = asyncio.create_task(runtime.bring_up(loader))

    with pytest.raises(asyncio.CancelledError):
        await bring_up
    assert loaded == []
