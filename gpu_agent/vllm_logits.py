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
always takes it too: its token at each place in the completion is drawn with a uniform number
of that place's own (`place_uniform`), so a stream moved anywhere draws what it would have
drawn unmoved.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from gpu_agent.grammar import Grammars
from gpu_agent.seeded_sampling import SeededSampling, seeded_draws
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
        seeded = [
            (index, row, row.sampling)
            for index, row in self._rows.items()
            if row.sampling is not None
        ]
        if seeded:
            self._draw(logits, seeded)
        return logits

    @staticmethod
    def _draw(logits: torch.Tensor, seeded: Sequence[tuple[int, _Row, SeededSampling]]) -> None:
        """Draw the seeded rows' tokens in one pass: each the only token vLLM is left."""
        width = logits.shape[-1]
        indices = torch.tensor([index for index, _, _ in seeded], device=logits.device)
        scores = logits[indices].to(torch.float32)
        for position, (_, row, sampling) in enumerate(seeded):
            if row.repeated is not None:
                # As vLLM's repetition penalty: over the prompt and the reply.
                penalty = sampling["repetition_penalty"]
                seen = row.repeated[:width].to(logits.device)
                row_scores = scores[position]
                scores[position] = torch.where(
                    seen,
                    torch.where(row_scores > 0, row_scores / penalty, row_scores * penalty),
                    row_scores,
                )
        samplings = [sampling for _, _, sampling in seeded]
        tokens = seeded_draws(scores, samplings, [row.place for _, row, _ in seeded])
        logits[indices] = float("-inf")
        logits[indices, tokens] = 0.0
