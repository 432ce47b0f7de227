"""The chat page in headless Debian Chromium (Playwright), against a real gateway and agents.

Replies come from a synthetic engine that echoes the prompt's last user message, so a test
chooses the model's text exactly: hostile Markdown, a long reply, a reply cut at the limit.
"""

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
from playwright.async_api import Browser, Page, Route, WebSocket, async_playwright, expect
from pydantic import SecretStr
from structlog.testing import capture_logs

import gateway.routes.chat_page as chat_page_module
from gateway.chat_vendor import DEFAULT_CACHE, LIBRARY_DIR, fetch_libraries, load_manifest
from gpu_agent.synthetic_engine import SyntheticEngine
from spotgate.apikeys import parse_api_key
from spotgate.protocol import GenerateFrame
from spotgate.registry import Registry
from spotgate.settings import AgentSettings, SyntheticSettings, TokenSettings
from spotgate.tokens import SigningKey
from stack.emulator import AwsEmulator
from tests.gateway.conftest import (
    MODEL,
    AgentProcesses,
    Gateway,
    GatewayAgentFactory,
    running_gateway,
    serving,
)
from tests.support.agents import AgentFactory, WedgingEngine, wait_for, wait_ready
from tests.support.clocks import ShiftedClock

CHROMIUM = os.environ.get("SPOTGATE_CHROMIUM", "/usr/bin/chromium")
OUTPUT_DIR = Path(os.environ.get("SPOTGATE_TEST_OUTPUT", "test-output")) / "chat"
REPO = Path(__file__).parents[2]
DOCS_SCREENSHOT = REPO / "docs" / "chat-page.png"
WRITE_DOCS = os.environ.get("SPOTGATE_WRITE_DOCS") == "1"
"""Set to refresh the README's screenshot (docs/chat-page.png) from this run."""
# Two cores shared with vLLM engines and other tests: give the page time before failing.
expect.set_options(timeout=10_000)


@pytest.fixture(scope="session", autouse=True)
def chat_libraries() -> None:
    """The page's Markdown libraries (`make test` fetches them first; alone, the first test)."""
    fetch_libraries(load_manifest(), REPO / DEFAULT_CACHE, LIBRARY_DIR)


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
    sent: list[dict[str, Any]] | None = None,
    errors: list[str] | None = None,
    permissions: list[str] | None = None,
) -> Page:
    """A fresh browser context on the page, connected, `model` chosen.

    `sent`: collects the `generate` frames the page sends; `errors`: its uncaught errors and
    Content-Security-Policy violations.
    """
    context = await browser.new_context(
        viewport={"width": width, "height": height}, permissions=permissions or []
    )
    page = await context.new_page()
    if fake_timers:  # the page's time flows, and the test can move it ahead
        await page.clock.install()
    if sent is not None:
        page.on("websocket", lambda socket: collect_generates(socket, sent))
    if errors is not None:
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on(
            "console", lambda m: errors.append(m.text) if "Content Security" in m.text else None
        )
    await page.goto(url)
    await expect(page.locator("#connection")).to_have_text("connected")
    await page.select_option("#model", model)
    return page


def collect_generates(socket: WebSocket, sent: list[dict[str, Any]]) -> None:
    def on_frame(payload: str | bytes) -> None:
        frame = json.loads(payload)
        if frame.get("type") == "generate":
            sent.append(frame)

    socket.on("framesent", on_frame)


async def send_prompt(page: Page, text: str, wait: bool = True) -> None:
    """Send `text`; with `wait`, until its reply is done."""
    replies = await page.locator(".message.assistant").count()
    await page.fill("#prompt", text)
    await page.press("#prompt", "Enter")
    if wait:
        meta = page.locator(".message.assistant .meta").nth(replies)
        await expect(meta).to_contain_text("tokens/s")


def echo_pace(
    tokens_per_second: float, max_model_len: int = 32_768, *, reasoning: bool = False
) -> SyntheticSettings:
    """A synthetic engine's settings to reply with the prompt's last message, a byte per token."""
    return SyntheticSettings(
        ttft_seconds=0.01,
        tokens_per_second=tokens_per_second,
        echo=True,
        max_model_len=max_model_len,
        reasoning=reasoning,
    )


def echo(
    tokens_per_second: float, max_model_len: int = 32_768, *, reasoning: bool = False
) -> SyntheticEngine:
    """A synthetic engine that replies with the prompt's last message, a byte per token."""
    pace = echo_pace(tokens_per_second, max_model_len, reasoning=reasoning)
    return SyntheticEngine(
        AgentSettings(engine="synthetic", served_model_name=MODEL, synthetic=pace)
    )


def held_echo(tokens_per_second: float, after_tokens: int | None = None) -> WedgingEngine:
    """An echo whose replies hang after `after_tokens` until released (`unwedge`)."""
    return WedgingEngine(MODEL, after_tokens, echo_pace(tokens_per_second))


async def test_a_prompt_streams_in_and_the_stats_fill(
    browser: Browser, gateway: Gateway, gateway_agent: GatewayAgentFactory
) -> None:
    engine = held_echo(tokens_per_second=60, after_tokens=20)
    await gateway_agent(engine=engine)
    page = await open_page(browser, gateway.url)
    prompt = "Spot instances are cheap; the gateway keeps every stream alive when one goes."

    await page.fill("#prompt", prompt)
    await page.press("#prompt", "Enter")
    reply = page.locator(".message.assistant .body")
    await expect(reply).to_have_text(prompt[:20])  # the reply hangs there, still streaming
    partial = await reply.inner_text()
    engine.unwedge()
    meta = page.locator(".message.assistant .meta")
    await expect(meta).to_contain_text("tokens/s", timeout=10_000)

    assert partial == prompt[:20]
    assert await reply.inner_text() == prompt
    stats = await meta.inner_text()
    assert "TTFT" in stats
    assert "(synthetic engine)" in stats
    assert f"{len(prompt.encode())} tokens" in stats


async def test_a_reasoning_models_thinking_shows_apart_from_its_answer(
    browser: Browser, gateway: Gateway, gateway_agent: GatewayAgentFactory, tmp_path: Path
) -> None:
    await gateway_agent(engine=echo(tokens_per_second=200, reasoning=True))
    page = await open_page(browser, gateway.url)

    await send_prompt(page, "<think>Spot is cheap; notices are short.</think>Use spot.")

    reply = page.locator(".message.assistant")
    await expect(reply.locator(".thinking")).to_contain_text("Spot is cheap; notices are short.")
    assert await reply.locator(".body").inner_text() == "Use spot."
    await page.reload()  # kept with the conversation
    await page.click("#chats li >> nth=0 >> .open")
    await expect(page.locator(".message.assistant .thinking")).to_contain_text("notices are short")
    # and with its export, imported into another browser
    async with page.expect_download() as downloading:
        await page.click("#export")
    exported = tmp_path / "chats.json"
    await (await downloading.value).save_as(exported)
    fresh = await open_page(browser, gateway.url)
    async with fresh.expect_file_chooser() as choosing:
        await fresh.click("#import")
    await (await choosing.value).set_files(exported)
    await fresh.click("#chats li >> nth=0 >> .open")
    await expect(fresh.locator(".message.assistant .thinking")).to_contain_text("notices are")
    assert await fresh.locator(".message.assistant .body").inner_text() == "Use spot."


RICH = """## Spot or on-demand?

Spot GPUs cost **far less**, but AWS can take one back with *two minutes'* notice.

- spot: cheap, interruptible
- on-demand: steady, pricier
  - keep one for the last replica

| lifecycle | price per hour | notice |
|---|--:|---|
| spot | $0.39 | 2 min |
| on-demand | $1.21 | none |

```python
def route(stream, agents):
    # the least loaded agent with room
    return min(agents, key=lambda a: a.active / a.capacity)
```

> A stream moves when its agent goes away.

More in [the docs](https://example.com/spotgate) and `spotgate pool status`.
"""


async def test_replies_render_as_markdown_with_highlighted_code(
    browser: Browser, gateway: Gateway, gateway_agent: GatewayAgentFactory
) -> None:
    await gateway_agent(engine=echo(tokens_per_second=4000))
    errors: list[str] = []
    page = await open_page(browser, gateway.url, errors=errors)
    await page.fill("#max-tokens", "4000")
    await send_prompt(page, RICH)

    body = page.locator(".message.assistant .body")
    await expect(body.locator("h2")).to_have_text("Spot or on-demand?")
    await expect(body.locator("strong")).to_have_text("far less")
    await expect(body.locator("em")).to_have_text("two minutes'")
    await expect(body.locator(":scope > ul > li")).to_have_count(2)
    await expect(body.locator("ul ul > li")).to_have_text("keep one for the last replica")
    await expect(body.locator("table th")).to_have_text(["lifecycle", "price per hour", "notice"])
    await expect(body.locator("table tbody tr")).to_have_count(2)
    assert await body.locator("table td").nth(1).get_attribute("align") == "right"
    await expect(body.locator("blockquote")).to_contain_text("A stream moves")
    link = body.locator("a")
    await expect(link).to_have_text("the docs")
    assert await link.get_attribute("href") == "https://example.com/spotgate"
    assert await link.get_attribute("rel") == "noopener noreferrer"
    assert await link.get_attribute("target") == "_blank"
    await expect(body.locator("p > code")).to_have_text("spotgate pool status")
    code = body.locator(".code pre code")
    assert await code.get_attribute("data-language") == "python"
    assert "hljs" in (await code.get_attribute("class") or "")
    await expect(code.locator("span.hljs-keyword").first).to_have_text("def")
    await expect(code.locator("span.hljs-comment")).to_have_text(
        "# the least loaded agent with room"
    )
    assert (await code.inner_text()).startswith("def route(stream, agents):\n")
    # highlight.js's theme, loaded with its integrity, colours the keywords.
    colour = await code.locator("span.hljs-keyword").first.evaluate(
        "e => getComputedStyle(e).color"
    )
    assert colour == "rgb(255, 123, 114)"
    await expect(body.locator(".code .copy")).to_be_visible()
    assert await page.locator("#render-note").is_hidden()
    assert errors == []


HOSTILE = (
    "<script>window.injected = 1</script>\n\n"
    '<img src=x onerror="window.injected = 2">\n\n'
    'Inline <b>bold?</b> <span onclick="window.injected = 3">click me</span> and '
    '<a href="javascript:window.injected = 4">a raw link</a>\n\n'
    "[a markdown link](javascript:window.injected=5) and <javascript:window.injected=6> and "
    "[data](data:text/html,hello) and [fine](https://example.com/ok)\n\n"
    '![a picture](https://example.com/x.png "t") ![x](x" onerror="window.injected=7)\n\n'
    '<iframe src="javascript:window.injected = 8"></iframe>\n\n'
    "<style>body { display: none }</style>\n\n"
    "<svg><script>window.injected = 9</script></svg> "
    '<math><mi xlink:href="javascript:1">m</mi></math>\n\n'
    "```html\n<script>window.injected = 10</script>\n```\n"
)


async def test_hostile_replies_stay_inert_text(
    browser: Browser, gateway: Gateway, gateway_agent: GatewayAgentFactory
) -> None:
    await gateway_agent(engine=echo(tokens_per_second=4000))
    errors: list[str] = []
    page = await open_page(browser, gateway.url, errors=errors)
    await page.fill("#max-tokens", "4000")
    await send_prompt(page, HOSTILE)

    reply = page.locator(".message.assistant .body")
    await reply.get_by_text("click me").click()
    for anchor in await reply.locator("a:not([href])").all():
        await anchor.click()  # would run a javascript: target, had one stayed
    await page.wait_for_timeout(300)
    assert await page.evaluate("window.injected") is None
    dangerous = "script, img, iframe, style, svg, math, b, object, embed"
    dangerous += ", span:not([class^=hljs]):not([class^=language-])"  # highlight.js's own
    assert await reply.locator(dangerous).count() == 0
    handlers = await reply.evaluate(
        "b => [...b.querySelectorAll('*')].flatMap(e => [...e.attributes].map(a => a.name))"
        ".filter(name => name.startsWith('on'))"
    )
    assert handlers == []
    links = await reply.locator("a").evaluate_all(
        "links => links.map(a => [a.textContent, a.getAttribute('href'), a.rel])"
    )
    assert [href for _text, href, _rel in links if href] == [
        "https://example.com/ok",
        "https://example.com/x.png",  # an image is a link to it: nothing loads by itself
    ]
    assert all(rel == "noopener noreferrer" for _text, href, rel in links if href)
    assert {text for text, href, _rel in links if not href} >= {"a markdown link", "data"}
    text = await reply.inner_text()
    assert "<script>window.injected = 1</script>" in text  # shown, not run
    assert '<img src=x onerror="window.injected = 2">' in text
    assert "<b>bold?</b>" in text
    code = reply.locator(".code pre code")
    assert await code.inner_text() == "<script>window.injected = 10</script>\n"
    assert await code.get_attribute("data-language") == "html"
    assert errors == []  # nothing even reached the Content-Security-Policy


async def test_a_streamed_reply_renders_incrementally_and_ends_as_a_one_shot_render(
    browser: Browser, gateway: Gateway, gateway_agent: GatewayAgentFactory
) -> None:
    await gateway_agent(engine=echo(tokens_per_second=200))
    page = await open_page(browser, gateway.url)
    await page.fill("#max-tokens", "4000")
    # Long enough to go on streaming well after the table (7 s more, about 8 s in all).
    long_reply = RICH + "".join(
        f"\nParagraph {n} keeps the reply going a while.\n" for n in range(24)
    )
    await send_prompt(page, long_reply, wait=False)
    body = page.locator(".message.assistant .body")
    # Once a table follows them, the heading and the paragraph are settled: kept as they are.
    await expect(body.locator("table")).to_be_visible(timeout=20_000)
    settled = await body.evaluate(
        """b => {
            window.redone = [];
            new MutationObserver(records => records.forEach(r => r.removedNodes.forEach(
                n => window.redone.push(n.nodeName)))).observe(b, {childList: true});
            const kept = [b.querySelector("h2"), b.querySelector("p")];
            kept.forEach(node => { node.keptWhileStreaming = true; });
            return kept.length;
        }"""
    )
    assert settled == 2
    assert "tokens/s" not in await page.locator(".message.assistant .meta").inner_text()
    await expect(page.locator(".message.assistant .meta")).to_contain_text(
        "tokens/s", timeout=60_000
    )

    assert await body.evaluate("b => b.querySelector('h2').keptWhileStreaming") is True
    assert await body.evaluate("b => b.querySelector('p').keptWhileStreaming") is True
    redone = await page.evaluate("window.redone")
    assert redone, "the open end was re-rendered as the reply grew"
    assert "H2" not in redone
    one_shot = """async text => {
        const { loadRenderer } = await import("/static/markdown.js");
        const renderer = await loadRenderer();
        const fresh = document.createElement("div");
        renderer.renderOnce(fresh, text);
        return fresh.innerHTML;
    }"""
    assert await body.inner_html() == await page.evaluate(one_shot, long_reply)

    # A link definition reaches back: a reply with one is rendered whole, still the same.
    text = "[ref link][r] before its definition\n\n- a list\n\n[r]: https://example.com/r\n"
    await send_prompt(page, text)
    last = page.locator(".message.assistant .body").last
    await expect(last.locator("a", has_text="ref link")).to_have_attribute(
        "href", "https://example.com/r"
    )
    assert await last.inner_html() == await page.evaluate(one_shot, text)


TRICKY = [
    "1. a\n\n2. b\n\n   more of b\n\n3. c\n\nafter",  # a list that goes on past blank lines
    "Title\n---\nbody\n===\n\n- x\n\n  still x\n- y\n\nz",  # setext headings, a loose list
    "a | b\n--|--\n1 | 2\n\npara\n\n    indented code\n\n> quote\nlazy line\n\nend",
    "see [r] and [s]\n\n- one\n\n[r]: https://example.com/r\n[s]: https://example.com/s",
    "```js\nlet open = 'fence never closed'\n\n- not a list",
    "para\n   3. not a list\n  - but this is\n\n<div>raw</div>\n\n***\n\n# h",
]


async def test_incremental_rendering_matches_a_one_shot_render_however_the_text_arrives(
    browser: Browser, chat_gateway: Gateway
) -> None:
    page = await open_page(browser, chat_gateway.url, model="scalable")
    mismatches = await page.evaluate(
        """async samples => {
            const { loadRenderer } = await import("/static/markdown.js");
            const renderer = await loadRenderer();
            const bad = [];
            for (const text of samples) {
                const once = document.createElement("div");
                renderer.renderOnce(once, text);
                for (const step of [1, 3, 7]) {  // characters per delta
                    const streamed = document.createElement("div");
                    const view = renderer.view(streamed);
                    for (let end = step; end < text.length + step; end += step) {
                        view.set(text.slice(0, end));
                        view.flush();
                    }
                    if (streamed.innerHTML !== once.innerHTML) bad.push([step, text]);
                }
            }
            return bad;
        }""",
        TRICKY,
    )
    assert mismatches == []


async def test_the_page_loads_its_libraries_with_integrity_under_a_strict_policy(
    chat_gateway: Gateway,
) -> None:
    async with aiohttp.ClientSession() as http, http.get(chat_gateway.url) as response:
        page = await response.text()
        policy = response.headers["Content-Security-Policy"]
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
    assert directives["script-src"] == "'self'"
    assert directives["style-src"] == "'self'"
    assert "unsafe" not in policy
    assert not re.search(r"<script(?![^>]*\ssrc=)", page)  # nothing inline
    for file in load_manifest():
        href = f"/static/vendor/{file.served}"
        if file.is_style:
            tag = f'<link rel="stylesheet" href="{href}" integrity="{file.integrity}">'
        else:
            tag = (
                f'<link rel="modulepreload" href="{href}" integrity="{file.integrity}" '
                f'data-library="{file.role}">'
            )
        assert tag in page


async def test_a_tampered_library_is_refused_and_replies_show_as_plain_text(
    browser: Browser, gateway: Gateway, gateway_agent: GatewayAgentFactory
) -> None:
    await gateway_agent(engine=echo(tokens_per_second=4000))
    context = await browser.new_context()
    page = await context.new_page()

    async def tampered(route: Route) -> None:
        response = await route.fetch()
        await route.fulfill(response=response, body=await response.body() + b"\n// changed\n")

    await page.route("**/marked.esm.js", tampered)
    await page.goto(gateway.url)
    await expect(page.locator("#connection")).to_have_text("connected")
    await page.select_option("#model", MODEL)
    note = page.locator("#render-note")
    await expect(note).to_contain_text("Replies show as plain text")
    await expect(note).to_contain_text("did not load")
    await send_prompt(page, "**not bold** <b>nor this</b>")
    reply = page.locator(".message.assistant .body")
    assert await reply.inner_text() == "**not bold** <b>nor this</b>"
    assert await reply.locator("strong, b").count() == 0


async def test_a_gateway_without_the_libraries_says_so_and_the_page_shows_plain_text(
    browser: Browser,
    aws: AwsEmulator,
    gateway_key: SigningKey,
    start_agent: AgentFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(chat_page_module, "LIBRARY_DIR", tmp_path)  # nothing fetched there
    with capture_logs() as logs:
        async with local_gateway(aws, gateway_key) as bare:
            warnings = [log for log in logs if log["log_level"] == "warning"]
            assert any("plain text" in log["event"] for log in warnings), logs
            await start_trusting_agent(start_agent, bare)
            page = await open_page(browser, bare.url)
            await expect(page.locator("#render-note")).to_have_text(
                "Replies show as plain text: this gateway does not serve the Markdown libraries."
            )
            assert await page.locator("link[rel=modulepreload]").count() == 0
            await send_prompt(page, "# not a heading\n\n- nor a list")
            reply = page.locator(".message.assistant .body")
            assert await reply.inner_text() == "# not a heading\n\n- nor a list"
            assert await reply.locator("h1, li").count() == 0


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

    await wait_for(engine_idle)
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
    browser: Browser,
    gateway: Gateway,
    agent_processes: AgentProcesses,
) -> None:
    agents = await agent_processes(2, 30.0)

    async def both_routable() -> bool:
        view = gateway.state.dispatcher.view
        return all(view.record(agent.agent_id) is not None for agent in agents)

    await wait_for(both_routable, within=60)
    page = await open_page(browser, gateway.url)
    # 5 s of reply at 30 tokens/s: the kill lands mid-reply even on a loaded machine.
    await page.fill("#max-tokens", "150")
    await page.fill("#prompt", "keep talking")
    await page.press("#prompt", "Enter")
    meta = page.locator(".message.assistant .meta")
    # The stream's own handle for its agent, never the agent's id.
    await expect(meta).to_contain_text(re.compile(r"^on [0-9a-f]{16}…"))
    handle = (await meta.inner_text()).removeprefix("on ").removesuffix("…")
    body = page.locator(".message.assistant .body")
    await expect(body).to_have_text(re.compile(r".{20,}"))  # a few tokens in, before the kill

    [victim_id] = serving(gateway)
    victim = next(agent for agent in agents if agent.agent_id == victim_id)
    victim.process.send_signal(signal.SIGKILL)

    moved = page.locator(".message.assistant .moved")
    await expect(moved).to_contain_text(f"moved from {handle} to ", timeout=15_000)
    assert "proc-" not in await moved.inner_text()
    await expect(meta).to_contain_text("150 tokens", timeout=15_000)
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


FOCUS = """() => {
    const e = document.activeElement;
    return e.id || `${e.tagName.toLowerCase()}.${e.className}:${e.textContent.trim().slice(0, 20)}`;
}"""


async def tab_through(page: Page, presses: int = 60) -> list[str]:
    """What Tab reaches, in order, from the top of the page."""
    await page.locator("body").evaluate("b => document.activeElement.blur()")
    reached = []
    for _ in range(presses):
        await page.keyboard.press("Tab")
        reached.append(await page.evaluate(FOCUS))
    return reached


async def test_the_page_works_with_the_keyboard_alone(
    browser: Browser, gateway: Gateway, gateway_agent: GatewayAgentFactory
) -> None:
    engine = held_echo(tokens_per_second=20)
    await gateway_agent(engine=engine)
    page = await open_page(browser, gateway.url)
    await page.fill("#max-tokens", "400")
    await page.focus("#prompt")
    await page.keyboard.type("```python")
    await page.keyboard.press("Shift+Enter")
    await page.keyboard.type("x = 1")
    await page.keyboard.press("Shift+Enter")
    await page.keyboard.type("```")
    assert await page.input_value("#prompt") == "```python\nx = 1\n```"
    await page.keyboard.press("Enter")  # sends
    await expect(page.locator(".message.assistant .meta")).to_contain_text("tokens/s")

    reached = await tab_through(page)
    for control in ("new-chat", "search", "export", "import", "forget-key", "model",
                    "max-tokens", "temperature", "prompt", "send"):  # fmt: skip
        assert control in reached, (control, reached)
    chat_controls = {"button.open:```python x = 1 ```", "button.rename:✎", "button.delete:✕"}
    reply_controls = {
        "button.copy:Copy",
        "button.copy-reply:Copy reply",
        "button.regenerate:Regenerate",
    }
    assert chat_controls <= set(reached), reached
    assert reply_controls <= set(reached), reached
    assert "summary.:System prompt" in reached

    # Regenerate from the keyboard: back from the message box to the reply's buttons.
    await page.focus("#prompt")
    for _ in range(10):
        if await page.evaluate(FOCUS) == "button.regenerate:Regenerate":
            break
        await page.keyboard.press("Shift+Tab")
    engine.hang_after(3)  # the regenerated reply is under way while the page is looked at
    await page.keyboard.press("Enter")
    meta = page.locator(".message.assistant .meta")
    await expect(page.locator("#stop")).to_be_visible()
    engine.unwedge()
    await expect(meta).to_contain_text("tokens/s")
    await expect(page.locator(".message.assistant")).to_have_count(1)

    # Esc stops a reply, wherever the focus is.
    engine.hang_after(10)
    await page.focus("#prompt")
    await page.keyboard.type("a long reply that Esc will stop " * 5)
    await page.keyboard.press("Enter")
    await expect(meta.last).to_contain_text("on ")
    await expect(page.locator(".message.assistant .body").last).to_contain_text("a long")
    await page.keyboard.press("Escape")
    await expect(meta.last).to_contain_text("stopped")

    async def engine_idle() -> bool:
        return engine.running() == 0

    await wait_for(engine_idle)
    await expect(page.locator("#send")).to_be_visible()

    # Rename from the keyboard: Enter on ✎, type, Enter.
    await page.focus("#chats li .rename")
    await page.keyboard.press("Enter")
    await expect(page.locator("#chats .rename-input")).to_be_focused()
    await page.keyboard.press("Control+A")
    await page.keyboard.type("keyboard only")
    await page.keyboard.press("Enter")
    await expect(page.locator("#chats li .open")).to_have_text(["keyboard only"])
    await expect(page.locator("#chats li .rename")).to_be_focused()


async def test_screenshot_of_a_rendered_reply_for_the_readme(
    browser: Browser, gateway: Gateway, gateway_agent: GatewayAgentFactory
) -> None:
    await gateway_agent(engine=echo(tokens_per_second=4000))
    page = await open_page(browser, gateway.url, 1280, 1000)
    await page.fill("#max-tokens", "4000")
    await send_prompt(page, RICH)
    reply = page.locator(".message.assistant")
    await expect(reply.locator("table")).to_be_visible()
    await expect(reply.locator("span.hljs-keyword").first).to_be_visible()
    await reply.scroll_into_view_if_needed()
    OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUTPUT_DIR / "chat-page.png"
    await page.screenshot(path=str(path))
    assert path.stat().st_size > 30_000
    if WRITE_DOCS:
        shutil.copyfile(path, DOCS_SCREENSHOT)
    assert DOCS_SCREENSHOT.is_file(), "SPOTGATE_WRITE_DOCS=1 writes docs/chat-page.png"


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
    engine = held_echo(tokens_per_second=40, after_tokens=20)
    await gateway_agent(engine=engine)
    sent: list[dict[str, Any]] = []
    page = await open_page(browser, gateway.url, sent=sent)
    prompt = "A gateway may go away mid-reply; the page holds what it got and carries on."
    await page.fill("#prompt", prompt)
    await page.press("#prompt", "Enter")
    reply = page.locator(".message.assistant .body")
    await expect(reply).to_have_text(prompt[:20])  # a few tokens in, and it hangs there

    for socket in list(gateway.state.sockets):  # as if its gateway had died
        await socket.close(code=WSCloseCode.INTERNAL_ERROR, message=b"gone")
    engine.unwedge()  # the resumed stream goes on

    await expect(page.locator(".message.assistant .moved")).to_contain_text(
        "resumed; nothing was lost", timeout=15_000
    )
    meta = page.locator(".message.assistant .meta")
    await expect(meta).to_contain_text("tokens/s", timeout=15_000)
    assert await reply.inner_text() == prompt  # exact: nothing lost, nothing twice
    assert f"{len(prompt.encode())} tokens" in await meta.inner_text()
    assert await page.locator(".message .error").count() == 0
    # The page brought back the receipt of what it got: the key is not charged for it again.
    first, resumed = sent
    assert "resume" not in first
    assert resumed["resume"]["receipt"]
    key = gateway.state.settings.chat_dev_api_key
    assert key is not None
    key_id = parse_api_key(key.get_secret_value()).key_id
    assert gateway.state.receipts.delivered(key_id, GenerateFrame.model_validate(resumed))


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

    await wait_for(routable)


STORED_CHATS = """() => new Promise((resolve, reject) => {
    const open = indexedDB.open("spotgate");
    open.onerror = () => reject(open.error);
    open.onsuccess = () => {
        const read = open.result.transaction("chats").objectStore("chats").getAll();
        read.onerror = () => reject(read.error);
        read.onsuccess = () => {
            open.result.close();
            resolve(read.result.sort((a, b) => b.updated - a.updated));
        };
    };
})"""


async def stored_chats(page: Page, settled: Callable[[list[Any]], bool]) -> list[Any]:
    """The conversations in the page's IndexedDB, once `settled` holds (writes are async)."""
    deadline = time.monotonic() + 30  # a bound for a loaded machine, not a speed
    while True:
        chats: list[Any] = await page.evaluate(STORED_CHATS)
        if settled(chats) or time.monotonic() > deadline:
            return chats
        await asyncio.sleep(0.1)


def replies_done(count: int) -> Callable[[list[Any]], bool]:
    def done(chats: list[Any]) -> bool:
        replies = [m for chat in chats for m in chat["messages"] if m["role"] == "assistant"]
        return len(replies) == count and all(m.get("meta") for m in replies)

    return done


async def test_conversations_live_in_indexeddb_keep_their_session_and_the_key_can_go(
    browser: Browser, gateway: Gateway, gateway_agent: GatewayAgentFactory
) -> None:
    await gateway_agent(engine=echo(tokens_per_second=2000))
    page = await open_page(browser, gateway.url)
    for prompt in ("first chat", "second chat"):
        await page.click("#new-chat")
        await send_prompt(page, prompt)
    chats = await stored_chats(page, replies_done(2))

    assert [chat["title"] for chat in chats] == ["second chat", "first chat"]
    assert chats[0]["session"] != chats[1]["session"]
    assert await page.evaluate("localStorage.getItem('spotgate.chats')") is None
    await page.reload()
    await expect(page.locator("#connection")).to_have_text("connected")
    await expect(page.locator("#chats li .open")).to_have_text(["second chat", "first chat"])
    await page.click("#chats li >> nth=1 >> .open")
    assert await page.locator(".message.assistant .body").inner_text() == "first chat"

    await page.click("#forget-key")
    await expect(page.locator("#connection")).to_have_text("offline")
    await expect(page.locator("#key-form")).to_be_visible()


async def test_conversations_left_in_localstorage_move_to_indexeddb_once(
    browser: Browser, chat_gateway: Gateway
) -> None:
    page = await open_page(browser, chat_gateway.url, model="scalable")  # no agents here
    legacy = [  # as the page kept them before: newest first
        {"id": "b", "session": "s-b", "title": "newer", "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "**hello**", "meta": "agent · 3 tokens"}]},
        {"id": "a", "session": "s-a", "title": "older", "messages": [
            {"role": "user", "content": "yo"},
            {"role": "assistant", "content": "", "error": "no_capacity: none"}]},
    ]  # fmt: skip
    await page.evaluate("c => localStorage.setItem('spotgate.chats', JSON.stringify(c))", legacy)
    for _ in range(2):  # moved on the first load; the second finds them in IndexedDB only
        await page.reload()
        await expect(page.locator("#chats li .open")).to_have_text(["newer", "older"])
        assert await page.evaluate("localStorage.getItem('spotgate.chats')") is None
    chats = await page.evaluate(STORED_CHATS)
    assert [(chat["id"], chat["session"]) for chat in chats] == [("b", "s-b"), ("a", "s-a")]
    await expect(page.locator(".message.assistant .body strong")).to_have_text("hello")
    await page.click("#chats li >> nth=1 >> .open")
    await expect(page.locator(".message.assistant .error")).to_have_text("no_capacity: none")


async def test_conversations_can_be_searched_renamed_and_deleted(
    browser: Browser, gateway: Gateway, gateway_agent: GatewayAgentFactory
) -> None:
    await gateway_agent(engine=echo(tokens_per_second=2000))
    page = await open_page(browser, gateway.url)
    bravo = "bravo: bananas\n\nand kiwis, and further down, past the title, a mango"
    for prompt in ("alpha: apples", bravo, "charlie: cherries"):
        await page.click("#new-chat")
        await send_prompt(page, prompt)
    titles = page.locator("#chats li .open")
    bravo_title = "bravo: bananas and kiwis, and further do"  # 40 characters, one line
    await expect(titles).to_have_text(["charlie: cherries", bravo_title, "alpha: apples"])

    await page.fill("#search", "MANGO")  # what was said, not just the titles
    await expect(titles).to_have_text([bravo_title])
    await page.fill("#search", "ch")
    await expect(titles).to_have_text(["charlie: cherries"])
    await page.fill("#search", "durian")
    await expect(titles).to_have_count(0)
    await expect(page.locator("#no-match")).to_be_visible()
    await page.fill("#search", "")
    await expect(titles).to_have_count(3)

    await page.click("#chats li >> nth=1 >> .rename")
    rename = page.locator("#chats .rename-input")
    await expect(rename).to_be_focused()
    await rename.fill("Fruit talk")
    await rename.press("Enter")
    await expect(titles).to_have_text(["charlie: cherries", "Fruit talk", "alpha: apples"])
    await page.click("#chats li >> nth=2 >> .rename")
    await page.locator("#chats .rename-input").fill("not kept")
    await page.locator("#chats .rename-input").press("Escape")
    await expect(titles.nth(2)).to_have_text("alpha: apples")

    page.once("dialog", lambda dialog: asyncio.ensure_future(dialog.dismiss()))
    await page.click("#chats li >> nth=0 >> .delete")
    await expect(titles).to_have_count(3)
    page.once("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
    await page.click("#chats li >> nth=0 >> .delete")
    await expect(titles).to_have_text(["Fruit talk", "alpha: apples"])
    await stored_chats(page, lambda chats: len(chats) == 2)

    await page.reload()
    await expect(titles).to_have_text(["Fruit talk", "alpha: apples"])
    await page.click("#chats li >> nth=0 >> .open")
    assert await page.locator(".message.user .body").inner_text() == bravo


async def test_conversations_export_to_json_and_import_back_and_a_bad_file_is_refused(
    browser: Browser, gateway: Gateway, gateway_agent: GatewayAgentFactory, tmp_path: Path
) -> None:
    await gateway_agent(engine=echo(tokens_per_second=2000))
    page = await open_page(browser, gateway.url)
    for prompt in ("one `fish`", "two fish"):
        await page.click("#new-chat")
        await send_prompt(page, prompt)
    await stored_chats(page, replies_done(2))
    async with page.expect_download() as downloading:
        await page.click("#export")
    download = await downloading.value
    exported = tmp_path / download.suggested_filename
    await download.save_as(exported)
    body = json.loads(exported.read_text())
    assert body["format"] == "spotgate.chats"
    assert body["version"] == 1
    assert [chat["title"] for chat in body["chats"]] == ["two fish", "one `fish`"]
    assert body["chats"][1]["messages"][1]["content"] == "one `fish`"
    assert "view" not in body["chats"][1]["messages"][1]

    fresh = await open_page(browser, gateway.url)  # another browser profile: nothing kept

    async def import_file(path: Path) -> None:
        async with fresh.expect_file_chooser() as choosing:
            await fresh.click("#import")
        await (await choosing.value).set_files(path)

    bad_files = {
        "notes.json": ("not json at all", "it is not JSON"),
        "other.json": ('{"chats": []}', "not a spotgate conversations file"),
        "role.json": (
            json.dumps(
                {
                    **body,
                    "chats": [
                        {**body["chats"][0], "messages": [{"role": "system", "content": "x"}]}
                    ],
                }
            ),
            'chats[0].messages[0].role must be "user" or "assistant", not "system"',
        ),
        "content.json": (
            json.dumps(
                {**body, "chats": [{"title": "t", "messages": [{"role": "user", "content": 3}]}]}
            ),
            "chats[0].messages[0].content must be text",
        ),
    }
    for name, (text, problem) in bad_files.items():
        path = tmp_path / name
        path.write_text(text)
        await import_file(path)
        notice = fresh.locator("#notice")
        await expect(notice).to_contain_text(f"Could not import {name}: ")
        await expect(notice).to_contain_text(problem)
        await expect(notice).to_contain_text("Nothing was imported")
        await expect(fresh.locator("#chats li")).to_have_count(0)

    await import_file(exported)
    await expect(fresh.locator("#notice")).to_contain_text("Imported 2 conversations")
    await expect(fresh.locator("#chats li .open")).to_have_text(["two fish", "one `fish`"])
    await fresh.click("#chats li >> nth=1 >> .open")
    await expect(fresh.locator(".message.assistant .body code")).to_have_text("fish")
    stored = await stored_chats(fresh, lambda chats: len(chats) == 2)
    assert [chat["id"] for chat in stored] == [chat["id"] for chat in body["chats"]]
    await import_file(exported)  # again: the same conversations, not copies
    await expect(fresh.locator("#chats li")).to_have_count(2)


async def test_a_whole_reply_can_be_copied_and_the_last_regenerated(
    browser: Browser, gateway: Gateway, gateway_agent: GatewayAgentFactory
) -> None:
    await gateway_agent(engine=echo(tokens_per_second=2000))
    sent: list[dict[str, Any]] = []
    page = await open_page(
        browser, gateway.url, sent=sent, permissions=["clipboard-read", "clipboard-write"]
    )
    await send_prompt(page, "first *question*")
    await send_prompt(page, "## second\n\n- with a list")
    replies = page.locator(".message.assistant")
    # Only the last reply can be regenerated; every reply can be copied.
    await expect(replies.nth(0).locator(".regenerate")).to_have_count(0)
    await replies.nth(0).locator(".copy-reply").click()
    assert await page.evaluate("navigator.clipboard.readText()") == "first *question*"
    await replies.nth(1).locator(".copy-reply").click()
    await expect(replies.nth(1).locator(".copy-reply")).to_have_text("Copied")
    assert await page.evaluate("navigator.clipboard.readText()") == "## second\n\n- with a list"

    await replies.nth(1).locator(".regenerate").click()
    await expect(replies.nth(1).locator(".meta")).to_contain_text("tokens/s")
    await expect(replies).to_have_count(2)
    await expect(replies.nth(1).locator(".body h2")).to_have_text("second")
    assert len(sent) == 3
    assert sent[2]["messages"] == sent[1]["messages"]  # the same conversation, asked again
    assert sent[2]["id"] != sent[1]["id"]
    assert [m["content"] for m in sent[2]["messages"]] == [
        "first *question*", "first *question*", "## second\n\n- with a list"
    ]  # fmt: skip


async def test_the_models_tell_the_page_each_models_context(
    chat_gateway: Gateway, gateway_agent: GatewayAgentFactory
) -> None:
    await gateway_agent(engine=echo(tokens_per_second=2000, max_model_len=1234))
    key = chat_gateway.state.settings.chat_dev_api_key
    assert key is not None
    async with aiohttp.ClientSession() as http:
        headers = {"Authorization": f"Bearer {key.get_secret_value()}"}
        async with http.get(f"{chat_gateway.url}/v1/models", headers=headers) as response:
            assert response.status == 200
            models = await response.json()
    assert {model["id"]: model["max_model_len"] for model in models["data"]} == {
        "scalable": None,  # scales from zero: no agent has said
        MODEL: 1234,
    }


async def test_a_long_conversation_leaves_out_its_oldest_turns_to_fit_and_says_so(
    browser: Browser, gateway: Gateway, gateway_agent: GatewayAgentFactory
) -> None:
    max_model_len = 600
    await gateway_agent(engine=echo(tokens_per_second=4000, max_model_len=max_model_len))
    sent: list[dict[str, Any]] = []
    page = await open_page(browser, gateway.url, sent=sent)
    await page.fill("#max-tokens", "100")
    system = "You are terse."
    await page.click("#system-panel summary")
    await page.fill("#system", system)
    turns = [f"turn {n}: " + "spot capacity comes and goes " * 3 for n in range(1, 6)]
    for turn in turns:
        await send_prompt(page, turn)

    trimmed = page.locator(".message.assistant .trimmed")
    assert await page.locator(".message .error").count() == 0
    assert all(frame["messages"][0] == {"role": "system", "content": system} for frame in sent)

    # The synthetic engine's prompt is one token per byte of its transcript: each prompt sent
    # fits with its max_tokens, where the whole conversation would not have.
    def transcript(messages: list[dict[str, str]]) -> int:
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"
        return len(text.encode())

    whole = [{"role": "system", "content": system}]
    for n, turn in enumerate(turns):
        whole.append({"role": "user", "content": turn})
        frame = sent[n]
        assert frame["messages"][1:] == whole[len(whole) - len(frame["messages"]) + 1 :]
        assert transcript(frame["messages"]) + frame["max_tokens"] <= max_model_len
        whole.append({"role": "assistant", "content": turn})
    assert transcript(whole[:-1]) + 100 > max_model_len  # the last turn, sent whole
    assert len(sent[-1]["messages"]) < len(whole) - 1
    assert await trimmed.count() >= 2
    await expect(trimmed.last).to_contain_text(re.compile(r"The oldest \d+ messages were left out"))
    await expect(trimmed.last).to_contain_text(f"{MODEL}'s context of {max_model_len} tokens")
    await expect(page.locator(".message.assistant").first.locator(".trimmed")).to_have_count(0)


async def test_the_context_estimate_counts_high_and_drops_whole_turns(
    browser: Browser, chat_gateway: Gateway
) -> None:
    page = await open_page(browser, chat_gateway.url, model="scalable")
    result = await page.evaluate(
        """async () => {
            const { fitContext, messageTokens } = await import("/static/context.js");
            const user = (content) => ({ role: "user", content });
            const reply = (content, tokens) => ({ role: "assistant", content, tokens });
            const system = { role: "system", content: "be brief" };
            const history = [user("a".repeat(100)), reply("b".repeat(400), 120),
                             user("é".repeat(50)), reply("", undefined), user("latest")];
            const fit = (maxModelLen) => {
                const { messages, dropped, tokens } = fitContext(
                    { system, history, maxModelLen, completionTokens: 100 });
                return { sent: messages.map((m) => m.content.slice(0, 3)), dropped, tokens };
            };
            return {
                bytes: messageTokens(user("é".repeat(50))),  // 100 bytes, + 16
                learned: messageTokens(reply("b".repeat(400), 120)),
                all: fit(null), roomy: fit(1000), tight: fit(360), tiny: fit(50),
            };
        }"""
    )
    assert result["bytes"] == 116
    assert result["learned"] == 120  # a reply's own count, not its 400 bytes
    assert result["all"]["dropped"] == 0
    # system 24 + 116 + 120 + 116 + empty reply 16 + 22 + prompt 16 = 430 tokens
    assert result["roomy"] == {"sent": ["be ", "aaa", "bbb", "ééé", "", "lat"], "dropped": 0,
                               "tokens": 430}  # fmt: skip
    # 360 - 2% - 100 leaves 253: the first turn goes whole (its reply too), the failed reply
    # stays so turns still alternate, the system prompt stays.
    assert result["tight"] == {"sent": ["be ", "ééé", "", "lat"], "dropped": 2, "tokens": 194}
    # The newest turn goes whatever it takes: the agent says if it cannot fit.
    assert result["tiny"]["sent"] == ["be ", "lat"]
    assert result["tiny"]["dropped"] == 4


async def test_a_reply_cut_at_the_token_limit_can_be_continued_even_after_a_reload(
    browser: Browser, gateway: Gateway, gateway_agent: GatewayAgentFactory
) -> None:
    await gateway_agent(engine=echo(tokens_per_second=2000))
    sent: list[dict[str, Any]] = []
    page = await open_page(browser, gateway.url, sent=sent)
    prompt = "The gateway resumes a stream exactly where it stopped."  # 54 bytes
    await page.fill("#max-tokens", "20")
    await send_prompt(page, prompt)
    reply = page.locator(".message.assistant")
    await expect(reply.locator(".meta")).to_contain_text("cut at the token limit")
    assert await reply.locator(".body").inner_text() == prompt[:20].rstrip()
    await stored_chats(page, replies_done(1))

    await page.reload()
    await expect(page.locator("#connection")).to_have_text("connected")
    await page.select_option("#model", MODEL)
    await page.fill("#max-tokens", "20")
    for shown in (40, 54):
        await reply.locator(".continue").click()
        await expect(reply.locator(".body")).to_have_text(prompt[:shown])
        await expect(reply.locator(".meta")).to_contain_text(f"{shown} tokens")
    await expect(reply.locator(".meta")).not_to_contain_text("cut at the token limit")
    await expect(reply.locator(".continue")).to_have_count(0)
    assert [frame.get("resume", {}).get("completion_tokens") for frame in sent] == [None, 20, 40]
    assert [frame["max_tokens"] for frame in sent] == [20, 40, 60]
    assert sent[2]["resume"]["text"] == prompt[:40]


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


def policy_of(headers: Any) -> dict[str, str]:
    """The Content-Security-Policy's directives, by name."""
    policy = headers["Content-Security-Policy"]
    return dict(d.strip().split(" ", 1) for d in policy.split(";"))


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/", 200),
        ("GET", "/static/index.html", 200),  # the page's file itself, as well as `/`
        ("GET", "/static/chat.js", 200),
        ("GET", "/no/such/page", 404),  # aiohttp's own error page
        ("POST", "/", 405),
        ("GET", "/v1/models", 401),
    ],
)
async def test_every_response_carries_the_policy_and_cannot_be_framed(
    chat_gateway: Gateway, method: str, path: str, status: int
) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, f"{chat_gateway.url}{path}") as response,
    ):
        await response.read()
    assert response.status == status
    directives = policy_of(response.headers)
    assert directives["frame-ancestors"] == "'none'"
    assert directives["script-src"] == "'self'"
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Referrer-Policy"] == "no-referrer"
    # Connections to this gateway only: never a whole scheme (`ws:`, `wss:`) or a wildcard.
    sources = directives["connect-src"].split()
    assert sources == ["'self'", chat_gateway.url.replace("http://", "ws://")]
    assert not any(source.endswith(":") or "*" in source for source in sources)


@pytest.mark.parametrize(
    ("host", "scheme", "public", "expected"),
    [
        ("127.0.0.1:8080", "http", "http://127.0.0.1:8080", "ws://127.0.0.1:8080"),
        ("localhost:8080", "http", "http://127.0.0.1:8080", "ws://localhost:8080"),
        # Behind a TLS load balancer the request arrives as plain HTTP; the page is https.
        ("gw.example", "http", "https://gw.example", "wss://gw.example"),
        ("GW.example", "http", "https://gw.example", "wss://gw.example"),
        # A foreign name (DNS rebinding) is not this gateway's page: its name is not allowed.
        ("rebound.evil.example", "http", "https://gw.example", "wss://gw.example"),
        # A Host that would add directives of its own is never written into the policy.
        ("localhost:1; connect-src *", "http", "https://gw.example", "wss://gw.example"),
        (None, "http", "https://gw.example", "wss://gw.example"),
    ],
)
def test_the_policy_names_the_websocket_origin_the_page_connects_to(
    host: str | None, scheme: str, public: str, expected: str
) -> None:
    assert chat_page_module.websocket_origin(host, scheme, public) == expected


async def test_the_page_connects_under_a_loopback_name_other_than_its_public_url(
    browser: Browser, gateway: Gateway, gateway_agent: GatewayAgentFactory
) -> None:
    await gateway_agent()
    port = urlsplit(gateway.url).port
    errors: list[str] = []
    page = await open_page(browser, f"http://localhost:{port}/", errors=errors)
    await page.reload()  # and again, as a returning visitor would
    await expect(page.locator("#connection")).to_have_text("connected")
    assert errors == []  # the policy let the page reach its own socket under that name
