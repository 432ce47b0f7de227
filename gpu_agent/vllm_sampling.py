"""A request's vLLM `SamplingParams`, and the logprobs of vLLM's output as the agent's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpu_agent.engine import GenerationRequest, TokenLogprobs
from gpu_agent.seeded_sampling import SeededSampling
from gpu_agent.vllm_logits import EXTRA_ARGS_KEY, StreamSpec


def sampling_params(request: GenerationRequest) -> Any:
    """The `SamplingParams` of a request; what spans a resume goes to `StreamConstraints`.

    A seeded, sampled request is drawn there too, each token with a seed of its place in the
    completion, so it draws the same wherever it moved; vLLM then takes the one token left.
    """
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    spec: StreamSpec = {}
    presence, frequency = request.presence_penalty, request.frequency_penalty
    seeded = request.seed is not None and request.temperature > 0
    if (request.resume_ids or seeded) and (presence or frequency):
        # vLLM's own would count only the tokens generated after the resume.
        spec["presence_penalty"], spec["frequency_penalty"] = presence, frequency
        presence = frequency = 0.0
    if request.json_schema is not None:
        spec["json_schema"] = request.json_schema
    draw = {
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_k": request.top_k or 0,
        "min_p": request.min_p,
        "repetition_penalty": request.repetition_penalty,
    }
    if seeded and request.seed is not None:
        spec["sampling"] = SeededSampling(
            seed=request.seed,
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k or 0,
            min_p=request.min_p,
            repetition_penalty=request.repetition_penalty,
        )
        # vLLM greedy over the one token left; no penalty, filter or seed of its own.
        draw = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                "repetition_penalty": 1.0}  # fmt: skip
    if spec:
        spec["resumed"] = len(request.resume_ids)
    return SamplingParams(
        max_tokens=request.max_tokens,
        seed=None if seeded else request.seed,
        presence_penalty=presence,
        frequency_penalty=frequency,
        logit_bias=dict(request.logit_bias) if request.logit_bias else None,
        temperature=draw["temperature"],
        top_p=draw["top_p"],
        top_k=int(draw["top_k"]),
        min_p=draw["min_p"],
        repetition_penalty=draw["repetition_penalty"],
        min_tokens=request.min_tokens,
        ignore_eos=request.ignore_eos,
        logprobs=request.logprobs,
        extra_args={EXTRA_ARGS_KEY: spec} if spec else None,
        detokenize=False,
        output_kind=RequestOutputKind.DELTA,
    )


def token_logprobs(
    found: Sequence[dict[int, Any]] | None, ids: Sequence[int], top: int | None
) -> list[TokenLogprobs] | None:
    """Each generated token's logprob and its `top` alternatives, from vLLM's output."""
    if top is None or found is None:
        return None
    out = []
    for token_id, candidates in zip(ids, found, strict=True):
        ranked = sorted(
            (entry.rank, candidate, entry.logprob)
            for candidate, entry in candidates.items()
            if entry.rank is not None and entry.rank <= top
        )
        out.append(
            TokenLogprobs(
                token_id=token_id,
                logprob=candidates[token_id].logprob,
                top=[(candidate, logprob) for _rank, candidate, logprob in ranked[:top]],
            )
        )
    return out
