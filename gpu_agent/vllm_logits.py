"""What vLLM cannot carry over a resume: a grammar's state, penalties, a seeded sampler's draws.

A resumed stream reaches vLLM as its prompt followed by the tokens already generated. vLLM's
own structured outputs would start the grammar again at the first new token, its
presence/frequency penalties count only the new tokens, and its seeded sampler starts its
random draws afresh. `StreamConstraints`, a logits processor loaded into vLLM's engine core,
does all three over the whole completion instead: the request names what it needs in
`SamplingParams.extra_args[EXTRA_ARGS_KEY]` (`StreamSpec`), including how many of the
prompt's last tokens were generated before the resume.

Structured output always takes this path, fresh or resumed, so one grammar runs on both sides
of a move. Penalties use vLLM's own unless the stream was resumed. A seeded, sampled stream
always takes it too: its token at each place in the completion is drawn with a seed of that
place's own (`place_seed`), so a stream moved anywhere draws what it would have drawn unmoved.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from gpu_agent.grammar import Grammars
from spotgate.logging import get_logger

if TYPE_CHECKING:
    from vllm.config import VllmConfig

EXTRA_ARGS_KEY = "spotgate"
log = get_logger(__name__)


class StreamSpec(TypedDict, total=False):
    """What `StreamConstraints` applies to one request."""

    resumed: int
    """How many of the prompt's last tokens are the completion's, generated before a resume."""
    json_schema: str
    presence_penalty: float
    frequency_penalty: float
    sampling: SeededSampling


class SeededSampling(TypedDict):
    """A seeded, sampled stream's sampling, done here (vLLM then only takes the token drawn)."""

    seed: int
    temperature: float
    top_p: float
    top_k: int  # 0: every token
    min_p: float
    repetition_penalty: float


def place_seed(seed: int, place: int) -> int:
    """The seed of the draw for the completion's token at `place` (0: its first)."""
    digest = hashlib.blake2b(f"{seed}:{place}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1  # torch takes a seed below 2^63


def seeded_draw(logits: torch.Tensor, sampling: SeededSampling, place: int) -> int:
    """The token drawn from one row's logits as vLLM's sampler draws, with the place's seed.

    Temperature, then `min_p`, then top-k and top-p, then an exponential race (what vLLM's
    own random sampling is): the same distribution as vLLM's, other random numbers.
    """
    scaled = logits / sampling["temperature"]
    probs = torch.softmax(scaled, dim=-1)
    if sampling["min_p"] > 0:
        scaled = scaled.masked_fill(probs < sampling["min_p"] * probs.max(), float("-inf"))
    top_k = sampling["top_k"]
    if 0 < top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if sampling["top_p"] < 1.0:
        ordered, order = torch.sort(scaled, descending=True)
        cumulative = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
        beyond = cumulative - torch.softmax(ordered, dim=-1) >= sampling["top_p"]
        scaled = scaled.index_fill(0, order[beyond], float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    # On the logits' own device: a CUDA tensor cannot draw from a CPU generator.
    generator = torch.Generator(device=probs.device).manual_seed(
        place_seed(sampling["seed"], place)
    )
    race = torch.empty_like(probs).exponential_(generator=generator)
    return int((probs / race).argmax())


@dataclass(eq=False)
class _Row:
    """One constrained request: its completion so far, its matcher, its token counts."""

    resumed: list[int]
    output: list[int]  # vLLM's own list: it grows as tokens are generated
    matcher: Any
    presence_penalty: float
    frequency_penalty: float
    counts: torch.Tensor | None = None
    seen: int = 0  # output tokens already accepted and counted
    failed: bool = False
    sampling: SeededSampling | None = None
    repeated: torch.Tensor | None = None  # tokens of the prompt or completion (repetition)

    @property
    def place(self) -> int:
        """The place in the completion of the token drawn next (a token in flight counted)."""
        return len(self.resumed) + len(self.output)

    def advance(self) -> None:
        """Take in the tokens generated since the last step."""
        new = [token for token in self.output[self.seen :] if token >= 0]
        self.seen = len(self.output)
        if self.repeated is not None and new:
            self.repeated[torch.tensor(new)] = True
        if self.matcher is not None and not self.failed:
            for token in new:
                if not self.matcher.accept_token(token):  # only a masked step can lead here
                    self.failed = True
                    log.error("grammar refused a generated token", token_id=token)
                    break
        if self.counts is not None and new:
            self.counts.index_add_(0, torch.tensor(new), torch.ones(len(new)))

    @property
    def penalised(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


class StreamConstraints(LogitsProcessor):
    """Grammar masks and resume-spanning penalties, for the requests that ask for them."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        model_config = vllm_config.model_config
        self._vocab_size = int(model_config.get_vocab_size())
        self._tokenizer_name = model_config.tokenizer
        self._grammars: Grammars | None = None
        self._rows: dict[int, _Row] = {}

    def is_argmax_invariant(self) -> bool:
        """Masks and penalties change which token is most likely."""
        return False

    def _grammar_matcher(self, schema: str, after: list[int]) -> Any:
        if self._grammars is None:  # loaded on first use: most engines never see a schema
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self._tokenizer_name)
            self._grammars = Grammars(tokenizer, self._vocab_size)
        return self._grammars.matcher(schema, after)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Follow the batch's changes, then take in each row's new tokens."""
        if batch_update is not None:
            for index in batch_update.removed:
                self._rows.pop(index, None)
            for index, params, prompt_ids, output_ids in batch_update.added:
                spec: StreamSpec | None = (params.extra_args or {}).get(EXTRA_ARGS_KEY)
                if spec is None:
                    self._rows.pop(index, None)
                    continue
                self._rows[index] = self._row(spec, prompt_ids or [], output_ids)
            for first, second, direction in batch_update.moved:
                moving = self._rows.pop(first, None)
                if direction == MoveDirectionality.SWAP:
                    other = self._rows.pop(second, None)
                    if other is not None:
                        self._rows[first] = other
                else:
                    self._rows.pop(second, None)
                if moving is not None:
                    self._rows[second] = moving
        for row in self._rows.values():
            row.advance()

    def _row(self, spec: StreamSpec, prompt_ids: list[int], output_ids: list[int]) -> _Row:
        resumed_count = spec.get("resumed", 0)
        resumed = list(prompt_ids[len(prompt_ids) - resumed_count :]) if resumed_count else []
        schema = spec.get("json_schema")
        sampling = spec.get("sampling")
        row = _Row(
            resumed=resumed,
            output=output_ids,
            matcher=self._grammar_matcher(schema, resumed) if schema is not None else None,
            presence_penalty=spec.get("presence_penalty", 0.0),
            frequency_penalty=spec.get("frequency_penalty", 0.0),
            sampling=sampling,
        )
        if sampling is not None and sampling["repetition_penalty"] != 1.0:
            row.repeated = torch.zeros(self._vocab_size, dtype=torch.bool)
            if prompt_ids:  # the resumed tokens are the prompt's last ones: counted with it
                row.repeated[torch.tensor(prompt_ids)] = True
        if row.penalised:
            row.counts = torch.zeros(self._vocab_size)
            if resumed:
                row.counts.index_add_(0, torch.tensor(resumed), torch.ones(len(resumed)))
        return row

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Mask grammars' forbidden tokens, penalise repeats, draw seeded rows' tokens.

        A seeded row's drawn token is the only one vLLM is left to choose.
        """
        if not self._rows:
            return logits
        import xgrammar

        width = logits.shape[-1]
        guided = [index for index, row in self._rows.items() if row.matcher is not None]
        if guided:
            bitmask = xgrammar.allocate_token_bitmask(logits.shape[0], width)
            for index in guided:
                row = self._rows[index]
                if not row.failed:
                    row.matcher.fill_next_token_bitmask(bitmask, index)
            xgrammar.apply_token_bitmask_inplace(
                logits, bitmask.to(logits.device), vocab_size=width, indices=guided
            )
        for index, row in self._rows.items():
            if row.counts is None:
                continue
            counts = row.counts[:width].to(logits.device, logits.dtype)
            logits[index] -= row.frequency_penalty * counts
            logits[index] -= row.presence_penalty * (counts > 0).to(logits.dtype)
        for index, row in self._rows.items():
            if row.sampling is None:
                continue
            scores = logits[index].to(torch.float32)
            if row.repeated is not None:  # as vLLM's repetition penalty: over prompt and reply
                penalty = row.sampling["repetition_penalty"]
                seen = row.repeated[:width].to(logits.device)
                scores = torch.where(
                    seen, torch.where(scores > 0, scores / penalty, scores * penalty), scores
                )
            token = seeded_draw(scores, row.sampling, row.place)
            logits[index] = float("-inf")
            logits[index, token] = 0.0
        return logits
