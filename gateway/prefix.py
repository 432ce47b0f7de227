"""A prompt's prefix as the router matches it, and what the gateway sent to each agent.

vLLM keeps the KV of prompts it has seen in fixed-size blocks of tokens, each block's hash
chained to those before it, and skips the prefill of every leading block it finds. The gateway
has no tokenizer, so it does the same on characters: it reads a prompt in the order the model's
chat template renders it (the tools, then each message in turn), cuts that text into blocks of
`prefix_block_chars`, and chains their hashes. A conversation re-sent with one more turn, or an
agent loop re-sending its system prompt and tools, starts with the same blocks; a partial last
block is not matched, as vLLM caches only whole blocks.

Per agent the gateway remembers the blocks it recently sent there, at most a bound of them, the
least recently sent forgotten first; an agent that leaves the pool is forgotten.

A prompt also has a conversation key (its tools and messages up to the first user turn, which
every later turn of the conversation repeats): gateway replicas that have no record of a
conversation (another replica routed its earlier turns) still agree where it goes.

Every hash is keyed with the stream's tenant (`spotgate.tenancy`): equal text under two tenants
never matches, so where a stream lands says nothing of what another tenant sent. Only a system
prompt the operator declared shared (`shared_prompt_sha256`, the SHA-256 of its text) opening
a chat with no tools hashes the same for every tenant, up to its last whole block.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from spotgate.protocol import GenerateFrame
from spotgate.tenancy import shared_prompt_digest

_DIGEST_BYTES = 8


@dataclass(frozen=True, slots=True)
class PromptPrefix:
    """A prompt's chained block hashes and its conversation key."""

    blocks: tuple[int, ...]
    conversation: str


def prompt_text(frame: GenerateFrame) -> tuple[str, int]:
    """The prompt as one text in template order, and where its conversation key ends in it."""
    if frame.prompt is not None:
        return frame.prompt, len(frame.prompt)
    parts = [tool.model_dump_json(exclude_none=True) + "\n" for tool in frame.tools or ()]
    key_end: int | None = None
    for message in frame.messages or ():
        parts.append(message.model_dump_json(exclude_none=True) + "\n")
        if key_end is None and message.role == "user":
            key_end = sum(len(part) for part in parts)
    text = "".join(parts)
    return text, len(text) if key_end is None else key_end


def shared_chars(frame: GenerateFrame, shared_prompt_sha256: Collection[str]) -> int:
    """How much of the prompt's text every tenant may match: a shared system prompt's turn.

    Only a chat with no tools that opens with a system prompt whose SHA-256 is one of
    `shared_prompt_sha256`; anything else is matched within its own tenant alone.
    """
    messages = frame.messages
    if not shared_prompt_sha256 or not messages or frame.tools or messages[0].role != "system":
        return 0
    if shared_prompt_digest(messages[0].content) not in shared_prompt_sha256:
        return 0
    return len(messages[0].model_dump_json(exclude_none=True) + "\n")


def tenant_key(tenant: str) -> bytes:
    """The key every hash of a tenant's prompts is keyed with."""
    return hashlib.blake2b(tenant.encode("utf-8", "surrogatepass"), digest_size=32).digest()


def block_hashes(
    text: str, block_chars: int, *, tenant: str = "", shared: int = 0
) -> tuple[int, ...]:
    """Chained hashes of the whole blocks of `text`: equal at i means equal text up to block i.

    Blocks that end within the first `shared` characters hash alike for every tenant; from the
    first that does not, they are keyed with `tenant`, and so are all after it (the chain).
    """
    hashes: list[int] = []
    previous = b""
    key = tenant_key(tenant)
    for start in range(0, len(text) - block_chars + 1, block_chars):
        block = text[start : start + block_chars].encode("utf-8", "surrogatepass")
        scope = b"" if start + block_chars <= shared else key
        previous = hashlib.blake2b(previous + block, digest_size=_DIGEST_BYTES, key=scope).digest()
        hashes.append(int.from_bytes(previous, "big"))
    return tuple(hashes)


def prompt_prefix(
    frame: GenerateFrame,
    block_chars: int,
    *,
    tenant: str,
    shared_prompt_sha256: Collection[str] = (),
) -> PromptPrefix:
    """What the router matches of the frame's prompt, for streams of `tenant`."""
    text, key_end = prompt_text(frame)
    # A raw prompt's key is its first block: its start is all a completion shares.
    key_text = text[: min(key_end, block_chars)] if frame.prompt is not None else text[:key_end]
    # Always the tenant's own: replicas agree on it, and no other tenant's stream follows it.
    conversation = hashlib.blake2b(
        key_text.encode("utf-8", "surrogatepass"),
        digest_size=_DIGEST_BYTES,
        key=tenant_key(tenant),
    ).hexdigest()
    shared = shared_chars(frame, shared_prompt_sha256)
    return PromptPrefix(block_hashes(text, block_chars, tenant=tenant, shared=shared), conversation)


def tenant_session(tenant: str, session: str | None) -> str | None:
    """A client's `session` as routing hashes it: two tenants' equal sessions are unrelated."""
    return None if session is None else f"{tenant}\x00{session}"


class PrefixIndex:
    """The blocks this gateway recently sent to each agent, at most `blocks_per_agent` each."""

    def __init__(self, blocks_per_agent: int) -> None:
        self._blocks_per_agent = blocks_per_agent
        self._sent: dict[str, OrderedDict[int, None]] = {}

    def matched_blocks(self, agent_id: str, blocks: Sequence[int]) -> int:
        """How many of `blocks`, from the first, the agent was sent."""
        sent = self._sent.get(agent_id)
        if not sent:
            return 0
        matched = 0
        for block in blocks:
            if block not in sent:
                break
            matched += 1
        return matched

    def record(self, agent_id: str, blocks: Sequence[int]) -> None:
        """The agent was sent a prompt with these blocks."""
        sent = self._sent.setdefault(agent_id, OrderedDict())
        # Last to first, so a prompt's first blocks are the most recent: a block is of no use
        # without the ones before it, so the tail goes first when the bound is reached.
        for block in reversed(blocks):
            sent[block] = None
            sent.move_to_end(block)
        while len(sent) > self._blocks_per_agent:
            sent.popitem(last=False)

    def retain(self, agent_ids: Collection[str]) -> None:
        """Forget every agent but these (the others left the pool)."""
        for agent_id in [known for known in self._sent if known not in agent_ids]:
            del self._sent[agent_id]

    def blocks_held(self) -> int:
        """Blocks remembered over every agent."""
        return sum(len(sent) for sent in self._sent.values())
