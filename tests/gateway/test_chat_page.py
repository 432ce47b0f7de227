"""The chat page in headless Debian Chromium (Playwright), against a real gateway and agents."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import WSCloseCode
from playwright.async_api import Browser, Page, Route, async_playwright, expect
from pydantic import SecretStr

from gpu_agent.synthetic_engine import SyntheticEngine
from spotgate.registry import Registry
from spotgate.settings import AgentSettings, SyntheticSettings, TokenSettings
from spotgate.tokens import SigningKey
from stack.emulator import AwsEmulator
from tests.gateway.conftest import (
    MODEL,
    AgentProcess,
    Gateway,
    GatewayAgentFactory,
    running_gateway,
)
from tests.support.agents import AgentFactory, wait_for, wait_ready
from tests.support.clocks import ShiftedClock

CHROMIUM = os.environ.get("SPOTGATE_CHROMIUM", "/usr/bin/chromium")
OUTPUT_DIR = Path(os.environ.get("SPOTGATE_TEST_OUTPUT", "test-output")) / "chat"


@pytest.fixture(scope="session")
async def browser() -> AsyncIterator[Browser]:
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"Debian chromium is missing at {CHROMIUM}: `make test` installs it")
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield launched
        await launched.close()


@contextlib.asynccontextmanager
async def local_gateway(
    aws: AwsEmulator,
    gateway_key: SigningKey,
    rpm: int | None = None,
    clock: Callable[[], float] = time.time,
    **overrides: Any,
) -> AsyncIterator[Gateway]:
    """A gateway in local mode: the page is offered a dev key (limited to `rpm` if given)."""
    async with Registry.open(aws.settings()) as registry:
        await registry.create_tables()
        dev_key = await registry.create_key("dev", rpm=rpm)
    async with running_gateway(
        aws, gateway_key, clock, chat_dev_api_key=SecretStr(dev_key.api_key), **overrides
    ) as running:
        yield running


@pytest.fixture
async def chat_gateway(aws: AwsEmulator, gateway_key: SigningKey) -> AsyncIterator[Gateway]:
    async with local_gateway(aws, gateway_key) as running:
        yield running


@pytest.fixture
def gateway(chat_gateway: Gateway) -> Gateway:
    return chat_gateway  # agents started by `gateway_agent` trust this gateway


async def open_page(
    browser: Browser,
    url: str,
    width: int = 1280,
    height: int = 800,
    model: str = MODEL,
    *,
    fake_timers: bool = False,
) -> Page:
    context = await browser.new_context(viewport={"width": width, "height": height})
    page = await context.new_page()
    if fake_timers:  # the page's time flows, and the test can move it ahead
        await page.clock.install()
    await page.goto(url)
    await expect(page.locator("#connection")).to_have_text("connected")
    await page.select_option("#model", model)
    return page


def echo(tokens_per_second: float) -> SyntheticEngine:
    """A synthetic engine that replies with the prompt's last message, a byte per token."""
    return SyntheticEngine(
        AgentSettings(
            engine="synthetic",
            served_model_name=MODEL,
            synthetic=SyntheticSettings(
                ttft_seconds=0.01, tokens_per_second=tokens_per_second, echo=True
            ),
        )
    )


async def test_a_prompt_streams_in_and_the_stats_fill(
    browser: Browser, gateway: Gateway, gateway_agent: GatewayAgentFactory
) -> None:
    await gateway_agent(engine=echo(tokens_per_second=60))
    page = await open_page(browser, gateway.url)
    prompt = "Spot instances are cheap; the gateway keeps every stream alive when one goes."

    await page.fill("#prompt", prompt)
    await page.press("#prompt", "Enter")
    reply = page.locator(".message.assistant .body")
    await expect(reply).to_contain_text("Spot instances")
    partial = await reply.inner_text()
    meta = page.locator(".message.assistant .meta")
    await expect(meta).to_contain_text("tokens/s", timeout=10_000)

    assert 0 < len(partial) < len(prompt)  # seen while it was still streaming
    assert await reply.inner_text() == prompt
    stats = await meta.inner_text()
    assert "TTFT" in stats
    assert "(synthetic engine)" in stats
    assert f"{len(prompt.encode())} tokens" in stats


async def test_model_text_renders_as_text_and_fenced_code_as_a_code_block(
    browser: Browser, gateway: Gateway, gateway_agent: GatewayAgentFactory
) -> None:
    await gateway_agent(engine=echo(tokens_per_second=2000))
    page = await open_page(browser, gateway.url)
    hostile = (
        '<script>window.injected = 1</script> <img src=x onerror="window.injected = 2">\n\n'
        "```js\nconsole.log('<b>hi</b>')\n```\nafter the block"
    )
    await page.fill("#prompt", hostile)
    await page.press("#prompt", "Enter")
    await expect(page.locator(".message.assistant .meta")).to_contain_text("tokens/s")

    reply = page.locator(".message.assistant")
    assert await page.evaluate("window.injected") is None
    assert await page.locator(".message script, .message img, .message b").count() == 0
    assert "<script>window.injected = 1</script>" in await reply.locator("p").first.inner_text()
    code = reply.locator(".code pre code")
    assert await code.inner_text() == "console.log('<b>hi</b>')\n"
    assert await code.get_attribute("data-language") == "js"
    await expect(reply.locator(".code .copy")).to_be_visible()


async def test_stop_cancels_the_reply_in_the_engine(
    browser: Browser, gateway: Gateway, gateway_agent: GatewayAgentFactory
) -> None:
    engine = echo(tokens_per_second=20)
    await gateway_agent(engine=engine)
    page = await open_page(browser, gateway.url)
    await page.fill("#prompt", "a long reply that we will not wait for " * 4)
    await page.press("#prompt", "Enter")
    await expect(page.locator(".message.assistant .body")).to_contain_text("a long")
    assert engine.running() == 1

    await page.click("#stop")
    await expect(page.locator(".message.assistant .meta")).to_contain_text("stopped")

    async def engine_idle() -> bool:
        return engine.running() == 0

    await wait_for(engine_idle, within=5)
    await expect(page.locator("#send")).to_be_visible()


async def test_a_bad_key_is_shown_plainly(
    browser: Browser, aws: AwsEmulator, gateway_key: SigningKey
) -> None:
    async with running_gateway(aws, gateway_key) as plain:  # no dev key: the user pastes one
        context = await browser.new_context()
        page = await context.new_page()
        await page.goto(plain.url)
        await expect(page.locator("#key-form")).to_be_visible()
        await page.fill("#key-input", "sg-nosuchkey_" + "x" * 40)
        await page.click("#key-form button")
        notice = page.locator("#notice")
        await expect(notice).to_contain_text("The API key was refused")
        await expect(page.locator("#connection")).to_have_text("offline")


async def test_screenshots_at_desktop_and_phone_width(
    browser: Browser, gateway: Gateway, gateway_agent: GatewayAgentFactory
) -> None:
    await gateway_agent(engine=echo(tokens_per_second=2000))
    OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
    for name, width, height in (("desktop", 1280, 800), ("phone", 390, 844)):
        page = await open_page(browser, gateway.url, width, height)
        await page.fill("#prompt", "Show me some code:\n\n```python\nprint('hello, spot')\n```")
        await page.press("#prompt", "Enter")
        await expect(page.locator(".message.assistant .meta").last).to_contain_text("tokens/s")
        path = OUTPUT_DIR / f"chat-{name}-{width}x{height}.png"
        await page.screenshot(path=str(path))
        size = await page.evaluate("[document.documentElement.scrollWidth, innerWidth]")
        assert path.stat().st_size > 10_000
        assert size[0] <= size[1], f"{name}: the page scrolls sideways"


async def test_killing_the_serving_agent_mid_reply_moves_it_and_the_page_says_so(
    browser: Browser, gateway: Gateway, agent_processes: Callable[[int, float], list[AgentProcess]]
) -> None:
    agents = agent_processes(2, 30.0)

    async def both_routable() -> bool:
        view = gateway.state.dispatcher.view
        return all(view.record(agent.agent_id) is not None for agent in agents)

    await wait_for(both_routable, within=60)
    page = await open_page(browser, gateway.url)
    await page.fill("#max-tokens", "60")
    await page.fill("#prompt", "keep talking")
    await page.press("#prompt", "Enter")
    meta = page.locator(".message.assistant .meta")
    await expect(meta).to_contain_text("on proc-")
    serving = (await meta.inner_text()).removeprefix("on ").removesuffix("…")
    body = page.locator(".message.assistant .body")
    await expect(body).to_have_text(re.compile(r".{20,}"))  # a few tokens in, before the kill

    victim = next(agent for agent in agents if agent.agent_id == serving)
    victim.process.send_signal(signal.SIGKILL)

    await expect(page.locator(".message.assistant .moved")).to_contain_text(
        f"moved from {serving}", timeout=15_000
    )
    await expect(meta).to_contain_text("60 tokens", timeout=15_000)
    assert await page.locator(".message .error").count() == 0


async def test_shift_enter_is_a_new_line_and_enter_sends(
    browser: Browser, gateway: Gateway, gateway_agent: GatewayAgentFactory
) -> None:
    await gateway_agent(engine=echo(tokens_per_second=2000))
    page = await open_page(browser, gateway.url)
    await page.type("#prompt", "line one")
    await page.press("#prompt", "Shift+Enter")
    await page.type("#prompt", "line two")
    assert await page.input_value("#prompt") == "line one\nline two"
    assert await page.locator(".message").count() == 0

    await page.press("#prompt", "Enter")
    await expect(page.locator(".message.assistant .meta")).to_contain_text("tokens/s")
    assert await page.locator(".message.assistant .body").inner_text() == "line one\nline two"


async def test_queued_position_then_a_plain_no_capacity_error(
    browser: Browser, gateway: Gateway
) -> None:
    page = await open_page(browser, gateway.url, model="scalable")  # configured, no agents
    await page.fill("#prompt", "anyone there?")
    await page.press("#prompt", "Enter")
    meta = page.locator(".message.assistant .meta")
    await expect(meta).to_contain_text("queued: #1 in line")
    await expect(meta).to_contain_text("No capacity right now", timeout=15_000)
    await expect(meta).to_contain_text("Try again in")


async def test_rate_limited_says_how_long_to_wait(
    browser: Browser,
    aws: AwsEmulator,
    gateway_key: SigningKey,
    start_agent: AgentFactory,
) -> None:
    async with local_gateway(aws, gateway_key, rpm=1) as limited:
        await start_trusting_agent(start_agent, limited)
        page = await open_page(browser, limited.url)
        for prompt in ("first", "second"):
            await page.fill("#prompt", prompt)
            await page.press("#prompt", "Enter")
            await expect(page.locator("#send")).to_be_visible()
        last = page.locator(".message.assistant .meta").last
        await expect(last).to_contain_text("Rate limited")
        await expect(last).to_contain_text(re.compile(r"Try again in \d+ s"))


async def test_the_page_refreshes_its_token_and_reconnects_after_a_dropped_socket(
    browser: Browser, aws: AwsEmulator, gateway_key: SigningKey, start_agent: AgentFactory
) -> None:
    token = TokenSettings(
        signing_key_pem=SecretStr(gateway_key.to_pem()), ttl_seconds=3, leeway_seconds=0
    )
    clock = ShiftedClock()
    async with local_gateway(aws, gateway_key, clock=clock, token=token) as short_lived:
        await start_trusting_agent(start_agent, short_lived)
        page = await open_page(browser, short_lived.url, fake_timers=True)
        # The renewal answers only once the next prompt was sent: that prompt must wait for
        # the new token, not go out under the expired one.
        renewal_answers = asyncio.Event()

        async def slow_token(route: Route) -> None:
            await renewal_answers.wait()
            await route.continue_()

        await page.route("**/v1/token", slow_token)
        # 4 s later for the page and the gateway: the first token has expired, and the page
        # must fetch a fresh one and send it on its socket.
        async with page.expect_request(lambda r: r.url.endswith("/v1/token")) as refreshed:
            clock.advance(4)
            await page.clock.fast_forward(4000)
        assert (await refreshed.value).method == "POST"
        await page.fill("#prompt", "still here")
        await page.press("#prompt", "Enter")
        renewal_answers.set()
        meta = page.locator(".message.assistant .meta")
        await expect(meta).to_contain_text("tokens/s")

        for socket in list(short_lived.state.sockets):
            await socket.close(code=WSCloseCode.GOING_AWAY, message=b"going away")
        await expect(page.locator("#connection")).to_contain_text("reconnecting")
        await expect(page.locator("#connection")).to_have_text("connected", timeout=10_000)
        await page.fill("#prompt", "and again")
        await page.press("#prompt", "Enter")
        await expect(meta.last).to_contain_text("tokens/s")
        assert await page.locator(".message .error").count() == 0


async def test_a_reply_cut_by_a_dropped_socket_resumes_after_reconnecting(
    browser: Browser, gateway: Gateway, gateway_agent: GatewayAgentFactory
) -> None:
    await gateway_agent(engine=echo(tokens_per_second=40))
    page = await open_page(browser, gateway.url)
    prompt = "A gateway may go away mid-reply; the page holds what it got and carries on."
    await page.fill("#prompt", prompt)
    await page.press("#prompt", "Enter")
    reply = page.locator(".message.assistant .body")
    await expect(reply).to_have_text(re.compile(r".{15,}"))  # a few tokens in

    for socket in list(gateway.state.sockets):  # as if its gateway had died
        await socket.close(code=WSCloseCode.INTERNAL_ERROR, message=b"gone")

    await expect(page.locator(".message.assistant .moved")).to_contain_text(
        "resumed; nothing was lost", timeout=15_000
    )
    meta = page.locator(".message.assistant .meta")
    await expect(meta).to_contain_text("tokens/s", timeout=15_000)
    assert await reply.inner_text() == prompt  # exact: nothing lost, nothing twice
    assert f"{len(prompt.encode())} tokens" in await meta.inner_text()
    assert await page.locator(".message .error").count() == 0


async def start_trusting_agent(start_agent: AgentFactory, gateway: Gateway) -> None:
    """An echo agent that trusts `gateway`, routable from it."""
    agent = await wait_ready(
        await start_agent(
            echo(tokens_per_second=2000),
            pinned_public_key=gateway.signing_key.verify_key.to_pem(),
            token_issuer=gateway.url,
        )
    )
    agent_id = agent.runtime.identity.agent_id  # type: ignore[union-attr]

    async def routable() -> bool:
        return gateway.state.dispatcher.view.record(agent_id) is not None

    await wait_for(routable, within=10)


async def test_conversations_keep_their_own_session_survive_a_reload_and_the_key_can_go(
    browser: Browser, gateway: Gateway, gateway_agent: GatewayAgentFactory
) -> None:
    await gateway_agent(engine=echo(tokens_per_second=2000))
    page = await open_page(browser, gateway.url)
    for prompt in ("first chat", "second chat"):
        await page.click("#new-chat")
        await page.fill("#prompt", prompt)
        await page.press("#prompt", "Enter")
        await expect(page.locator(".message.assistant .meta")).to_contain_text("tokens/s")

    await page.reload()
    await expect(page.locator("#connection")).to_have_text("connected")
    chats = json.loads(await page.evaluate("localStorage.getItem('spotgate.chats')"))
    assert [chat["title"] for chat in chats] == ["second chat", "first chat"]
    assert chats[0]["session"] != chats[1]["session"]
    await page.click("#chats li >> nth=1")
    assert await page.locator(".message.assistant .body").inner_text() == "first chat"

    await page.click("#forget-key")
    await expect(page.locator("#connection")).to_have_text("offline")
    await expect(page.locator("#key-form")).to_be_visible()


async def test_auto_scroll_follows_the_reply_until_the_user_scrolls_up(
    browser: Browser, gateway: Gateway, gateway_agent: GatewayAgentFactory
) -> None:
    await gateway_agent(engine=echo(tokens_per_second=300))
    page = await open_page(browser, gateway.url, width=390, height=500)
    long_text = "\n\n".join(f"paragraph {n} of a long reply" for n in range(60))
    await page.fill("#max-tokens", "4000")
    await page.fill("#prompt", long_text)
    await page.press("#prompt", "Enter")
    body = page.locator(".message.assistant .body")
    await expect(body).to_contain_text("paragraph 20")
    at_bottom = "(() => { const m = document.getElementById('messages');"
    at_bottom += " return m.scrollHeight - m.scrollTop - m.clientHeight < 40; })()"
    # The page scrolls on its next frame after the text grows: wait for it (5 s at most).
    await page.wait_for_function(at_bottom, timeout=5_000)

    await page.locator("#messages").evaluate("m => m.scrollTo(0, 0)")
    await expect(page.locator(".message.assistant .meta")).to_contain_text("tokens/s")
    assert await page.locator("#messages").evaluate("m => m.scrollTop") == 0


@pytest.mark.parametrize(
    ("host", "offered"),
    [
        ("127.0.0.1", True),
        ("localhost", True),
        ("rebound.evil.example", False),  # DNS rebinding: a foreign name that resolves here
    ],
)
async def test_the_dev_key_is_given_only_under_the_gateways_own_names(
    chat_gateway: Gateway, host: str, offered: bool
) -> None:
    port = urlsplit(chat_gateway.url).port
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{chat_gateway.url}/chat/config.json", headers={"Host": f"{host}:{port}"}) as r,
    ):
        body = await r.json()
    if offered:
        assert r.status == 200
        assert body["dev_api_key"].startswith("sg-")
    else:
        assert r.status == 403
        assert "dev_api_key" not in body
