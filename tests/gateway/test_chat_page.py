"""The chat page in headless Debian Chromium (Playwright), against a real gateway and agents."""

from __future__ import annotations

import os
import re
import shutil
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect
from pydantic import SecretStr

from gpu_agent.synthetic_engine import SyntheticEngine
from spotgate.emulator import AwsEmulator
from spotgate.registry import Registry
from spotgate.settings import AgentSettings, SyntheticSettings
from spotgate.tokens import SigningKey
from tests.agents import wait_for
from tests.gateway.conftest import (
    MODEL,
    AgentProcess,
    Gateway,
    GatewayAgentFactory,
    running_gateway,
)

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


@pytest.fixture
async def chat_gateway(aws: AwsEmulator, gateway_key: SigningKey) -> AsyncIterator[Gateway]:
    """A gateway in local mode: the page is offered the dev key."""
    async with Registry.open(aws.settings()) as registry:
        await registry.create_tables()
        dev_key = await registry.create_key("dev")
    async with running_gateway(
        aws, gateway_key, chat_dev_api_key=SecretStr(dev_key.api_key)
    ) as running:
        yield running


@pytest.fixture
def gateway(chat_gateway: Gateway) -> Gateway:
    return chat_gateway  # agents started by `gateway_agent` trust this gateway


async def open_page(browser: Browser, url: str, width: int = 1280, height: int = 800) -> Page:
    context = await browser.new_context(viewport={"width": width, "height": height})
    page = await context.new_page()
    await page.goto(url)
    await expect(page.locator("#connection")).to_have_text("connected")
    await page.select_option("#model", MODEL)
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
