from __future__ import annotations

import pytest
import torch

from gpu_agent import seeded_sampling
from gpu_agent.seeded_sampling import SeededSampling, place_uniform, seeded_draws

SAMPLING = SeededSampling(
    seed=5, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0
)


def draw(logits: torch.Tensor, sampling: SeededSampling, place: int) -> int:
    """One row's draw, alone in its batch."""
    return int(seeded_draws(logits.unsqueeze(0), [sampling], [place])[0])


def test_a_places_draw_is_the_same_every_time_and_differs_from_place_to_place() -> None:
    logits = torch.zeros(1000)
    draws = [draw(logits, SAMPLING, place) for place in range(50)]
    assert draws == [draw(logits, SAMPLING, place) for place in range(50)]
    assert len(set(draws)) > 40  # uniform logits: the places' numbers differ
    assert place_uniform(5, 0) != place_uniform(6, 0)
    assert all(0.0 <= place_uniform(5, place) < 1.0 for place in range(1000))


@pytest.mark.parametrize(
    ("change", "allowed"),
    [
        ({"top_k": 2}, {9, 8}),
        ({"top_p": 0.5}, {9}),  # token 9 alone holds most of the mass
        ({"min_p": 0.5}, {9}),
        ({"top_k": 3, "top_p": 0.999}, {9, 8, 7}),
    ],
    ids=["top_k", "top_p", "min_p", "top_k and top_p"],
)
def test_the_filters_keep_the_draw_within_them(change: dict[str, float], allowed: set[int]) -> None:
    logits = torch.arange(10, dtype=torch.float32) * torch.tensor([1.0] * 9 + [3.0])
    sampling = SeededSampling(**{**SAMPLING, **change})  # type: ignore[typeddict-item]
    assert {draw(logits, sampling, place) for place in range(200)} <= allowed


def test_draws_follow_the_distribution() -> None:
    logits = torch.log(torch.tensor([1.0, 3.0, 0.0, 6.0]))  # 10 %, 30 %, none, 60 %
    counts = torch.bincount(
        torch.tensor([draw(logits, SAMPLING, place) for place in range(4000)]), minlength=4
    )
    assert counts[2] == 0
    assert [round(float(count) / 4000, 2) for count in counts] == pytest.approx(
        [0.1, 0.3, 0.0, 0.6], abs=0.03
    )


def test_a_rows_draw_in_a_batch_is_its_draw_alone() -> None:
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 500, generator=generator) * 3
    samplings = [
        SAMPLING,
        SeededSampling(**{**SAMPLING, "top_p": 0.7, "seed": 9}),  # type: ignore[typeddict-item]
        SeededSampling(**{**SAMPLING, "top_k": 5, "temperature": 0.5}),  # type: ignore[typeddict-item]
        SeededSampling(**{**SAMPLING, "min_p": 0.2}),  # type: ignore[typeddict-item]
        SeededSampling(**{**SAMPLING, "top_k": 40, "top_p": 0.9}),  # type: ignore[typeddict-item]
        SeededSampling(**{**SAMPLING, "temperature": 2.0}),  # type: ignore[typeddict-item]
    ]
    places = [0, 17, 3, 99, 4, 250]
    batched = seeded_draws(logits, samplings, places).tolist()
    assert batched == [
        draw(row, sampling, place)
        for row, sampling, place in zip(logits, samplings, places, strict=True)
    ]


@pytest.mark.parametrize(
    "change",
    [{"top_p": 0.9}, {"top_k": 300, "top_p": 0.95}, {"min_p": 0.001, "top_p": 0.9}],
    ids=["top_p", "top_k and top_p", "min_p and top_p"],
)
def test_a_nucleus_past_the_candidates_draws_as_the_candidates_would(
    monkeypatch: pytest.MonkeyPatch, change: dict[str, float]
) -> None:
    logits = torch.randn(4, 500, generator=torch.Generator().manual_seed(2))  # a wide nucleus
    sampling = SeededSampling(**{**SAMPLING, **change})  # type: ignore[typeddict-item]
    whole = [seeded_draws(logits, [sampling] * 4, [p] * 4).tolist() for p in range(30)]
    monkeypatch.setattr(seeded_sampling, "CANDIDATES", 8)  # closes within none: sorted whole
    assert [seeded_draws(logits, [sampling] * 4, [p] * 4).tolist() for p in range(30)] == whole
