"""Each token's own bytes, as its tokenizer's decoder writes them into a reply.

OpenAI's logprob entries carry a token's `bytes` so that a client joining them gets the
reply's UTF-8 even where a token holds part of a character. `decode([id]).encode()` does not
give them: a byte-fallback piece (`<0xE2>`, Llama-2, Gemma) or a byte-level piece holding part
of a character decodes alone to U+FFFD (three bytes for one), and a SentencePiece decoder that
strips the text's leading space (Llama-2's `Strip`) strips it from every piece decoded alone.
Here the decoder's own steps (tokenizers' `tokenizer.json`: ByteLevel, Replace, ByteFallback,
Fuse, Strip, Metaspace) are applied to one piece's bytes, the leading strip to the reply's
first piece only, so the bytes of a reply's pieces join to exactly what the decoder writes.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from typing import Any

BYTE_FALLBACK_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")

PieceBytes = Callable[[str], bytes]


@functools.cache
def _byte_level_chars() -> dict[str, int]:
    """GPT-2's byte-to-character table, inverted: the character each byte is written as."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(char): byte for byte, char in zip(printable, chars, strict=True)}


def _byte_level(piece: str) -> bytes:
    table = _byte_level_chars()
    return b"".join(bytes([table[char]]) if char in table else char.encode() for char in piece)


def _steps(decoder: dict[str, Any] | None) -> list[dict[str, Any]]:
    if decoder is None:
        return []
    if decoder.get("type") == "Sequence":
        return [step for inner in decoder["decoders"] for step in _steps(inner)]
    return [decoder]


class TokenBytes:
    """A tokenizer's pieces as the bytes its decoder writes for them."""

    def __init__(self, tokenizer_json: str, piece_of: Callable[[int], str | None]) -> None:
        """From the tokenizer's JSON (`Tokenizer.to_str()`) and its id → piece lookup."""
        document = json.loads(tokenizer_json)
        self._piece_of = piece_of
        self._special = {
            token["id"] for token in document.get("added_tokens", ()) if token.get("special")
        }
        self._replacements: list[tuple[str, str]] = []
        self._byte_level = False
        self._byte_fallback = False
        self._strip_first = 0
        for step in _steps(document.get("decoder")):
            kind = step.get("type")
            if kind == "ByteLevel":
                self._byte_level = True
            elif kind == "Replace" and "String" in step.get("pattern", {}):
                self._replacements.append((step["pattern"]["String"], step["content"]))
            elif kind == "ByteFallback":
                self._byte_fallback = True
            elif kind == "Strip" and step.get("content") == " ":
                self._strip_first = int(step.get("start", 0))
            elif kind == "Metaspace":
                self._replacements.append((step.get("replacement", "\u2581"), " "))
                if step.get("prepend_scheme", "always") != "never":
                    self._strip_first = 1

    def of(self, token_id: int, *, first: bool) -> bytes:
        """The bytes the token adds to a reply; `first`: it opens the reply."""
        piece = self._piece_of(token_id)
        if piece is None or token_id in self._special:
            return b""  # left out of replies, as the decoder leaves special tokens out
        if self._byte_fallback and (byte := BYTE_FALLBACK_PIECE.match(piece)):
            return bytes([int(byte.group(1), 16)])
        if self._byte_level:
            return _byte_level(piece)
        for pattern, content in self._replacements:
            piece = piece.replace(pattern, content)
        written = piece.encode()
        if first and self._strip_first:
            stripped = len(written) - len(written.lstrip(b" "))
            written = written[min(stripped, self._strip_first) :]
        return written
