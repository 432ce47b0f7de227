"""A seeded, sampled stream's draws: each place in the completion has a random number of its own.

vLLM's seeded sampler starts its random draws afresh when a stream is resumed elsewhere; here
the token at each place is drawn with that place's own uniform number (`place_uniform`), so a
stream moved anywhere draws what it would have drawn unmoved. The draw is vLLM's distribution
(temperature, then `min_p`, then top-k and top-p), taken by inverse transform: the first token,
most likely first, at which the kept tokens' cumulative probability passes the number.

Every seeded stream of an engine step is drawn in one pass over the batch. A filtered row looks
at its `CANDIDATES` most likely tokens first: a nucleus that closes within them (as an LLM's at
top-p 0.9 mostly does) needs no sort of the whole vocabulary; a row whose nucleus does not is
sorted whole, and draws the same token the candidates would have given.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TypedDict

import torch

PLACE_UNIFORM_BITS = 24
"""Bits of a place's uniform number: a float32 holds them exactly."""
CANDIDATES = 1024
"""The most likely tokens a filtered row's draw looks at before sorting its whole vocabulary."""


class SeededSampling(TypedDict):
    """A seeded, sampled stream's sampling, done by the agent (vLLM then only takes the token)."""

    seed: int
    temperature: float
    top_p: float
    top_k: int  # 0: every token
    min_p: float
    repetition_penalty: float


def place_uniform(seed: int, place: int) -> float:
    """The uniform number in [0, 1) that draws the completion's token at `place` (0: its first)."""
    digest = hashlib.blake2b(f"{seed}:{place}".encode(), digest_size=8).digest()
    drawn = int.from_bytes(digest, "big") >> (64 - PLACE_UNIFORM_BITS)
    return drawn / (1 << PLACE_UNIFORM_BITS)


def seeded_draws(
    logits: torch.Tensor, samplings: Sequence[SeededSampling], places: Sequence[int]
) -> torch.Tensor:
    """The token drawn from each row of `logits`, with its sampling, at its place.

    A row's draw depends on its logits, sampling and place alone, never on the batch.
    """
    width = logits.shape[-1]
    device = logits.device
    scaled = logits.to(torch.float32) / _column([s["temperature"] for s in samplings], device)
    uniforms = _column(
        [place_uniform(s["seed"], p) for s, p in zip(samplings, places, strict=True)], device
    )
    tokens = torch.empty(len(samplings), dtype=torch.long, device=device)
    filtered: list[int] = []
    plain: list[int] = []
    for index, sampling in enumerate(samplings):
        (filtered if _filters(sampling, width) else plain).append(index)
    if plain:  # no filter: the whole vocabulary, most likely first needs no order at all
        weights = torch.softmax(scaled[plain], dim=-1)
        tokens[plain] = _inverse_transform(weights, uniforms[plain])
    if filtered:
        rows = [samplings[i] for i in filtered]
        tokens[filtered] = _filtered_draws(scaled[filtered], rows, uniforms[filtered])
    return tokens


def _column(values: Sequence[float], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device).unsqueeze(1)


def _filters(sampling: SeededSampling, width: int) -> bool:
    """Whether the sampling keeps only some tokens (min_p, top-k or top-p)."""
    return sampling["min_p"] > 0 or 0 < sampling["top_k"] < width or sampling["top_p"] < 1.0


def _filtered_draws(
    scaled: torch.Tensor, samplings: Sequence[SeededSampling], uniforms: torch.Tensor
) -> torch.Tensor:
    """Draws for rows that filter: within their candidates, or over their whole sorted row."""
    log_total = torch.logsumexp(scaled, dim=-1, keepdim=True)
    values, ids = torch.topk(scaled, min(CANDIDATES, scaled.shape[-1]), dim=-1)
    weights, closed = _nucleus(values, log_total, samplings, scaled.shape[-1])
    tokens = ids.gather(1, _inverse_transform(weights, uniforms).unsqueeze(1)).squeeze(1)
    if not bool(closed.all()):
        open_rows = torch.nonzero(~closed).squeeze(1)
        listed = open_rows.tolist()
        ordered, order = torch.sort(scaled[open_rows], dim=-1, descending=True)
        weights, _ = _nucleus(
            ordered, log_total[open_rows], [samplings[i] for i in listed], scaled.shape[-1]
        )
        picked = _inverse_transform(weights, uniforms[open_rows]).unsqueeze(1)
        tokens[open_rows] = order.gather(1, picked).squeeze(1)
    return tokens


def _nucleus(
    values: torch.Tensor,
    log_total: torch.Tensor,
    samplings: Sequence[SeededSampling],
    width: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kept tokens' probabilities among the most likely `values`, and what is past them.

    `values` are each row's most likely logits, sorted, descending; per row, the second part
    says whether no token past them is kept (the nucleus closed within them).
    """
    device = values.device
    shown = values.shape[-1]
    probs = torch.exp(values - log_total)  # of the whole vocabulary
    floor = _column([s["min_p"] for s in samplings], device) * probs[:, :1]
    closed = probs[:, -1:] < floor  # every token past them is below min_p too
    kept = probs >= floor
    top_k = [s["top_k"] if 0 < s["top_k"] < width else width for s in samplings]
    kth = values.gather(1, torch.tensor([min(k, shown) - 1 for k in top_k], device=device)[:, None])
    within = torch.tensor([k <= shown for k in top_k], device=device).unsqueeze(1)
    kept &= ~within | (values >= kth)  # ties with the k-th stay, as vLLM's
    closed |= within
    weights = probs * kept
    # Shares of what min_p and top-k kept: a closed row's are all here, an open row lost none.
    total = torch.where(closed, weights.sum(dim=-1, keepdim=True), torch.ones_like(floor))
    shares = weights.cumsum(dim=-1) / total
    top_p = _column([s["top_p"] for s in samplings], device)
    weights = weights * (shares - weights / total < top_p)
    closed |= shares[:, -1:] >= top_p  # every token past them has at least that much above it
    closed |= torch.tensor(shown == width, device=device)
    return weights, closed.squeeze(1)


def _inverse_transform(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Per row, the first index at which the weights' running sum passes its uniform share."""
    cumulative = weights.cumsum(dim=-1)
    index = torch.searchsorted(cumulative, uniforms * cumulative[:, -1:], right=True).squeeze(1)
    # A product rounded up to the whole sum finds no index: the last one with weight takes it.
    return torch.where(index < weights.shape[-1], index, cumulative.argmax(dim=-1))
