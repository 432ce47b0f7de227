"""The move-gap benchmark's fixed values, and what a stream's arrivals say (pure).

`loadtest.bench.move_gap` runs the benchmark; this reads what its client recorded of each
stream into the gap the move left, without a process or a socket.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from loadtest.bench.report import median
from spotgate.settings import AgentSettings, SocketLimits

COMMAND = "python -m loadtest.bench.move_gap --write docs/benchmarks.md"
REPLY_TOKENS = 1200
TOKENIZER = "qwen3"
CONTEXT_TOKENS = (1000, 4000, 8000)
"""The conversations' lengths, in prompt tokens: a table by context length."""
# A ~32,000-token prompt and its reply must fit: the model's positions are raised to match.
MAX_MODEL_LEN = 36864
MODEL_POSITIONS = 40960
LONG_PROMPT_LIMITS = SocketLimits(max_frame_bytes=1 << 20, max_prompt_chars=400_000)
"""The gateways' and agents' sockets: a 32,000-token conversation is ~203,000 characters, past
the defaults' 64 KiB frame and 200,000 characters."""
GOAL_GAP_RATIO = 1.2
GOAL_REPLY_GAPS = 1.0
"""A move may cost the reply at most this many of its gaps (`MoveFigures.lost_gaps`)."""
TODAY, EARLY = "today's move", "make-before-break"
"""The two gateways: `queue.move_before_break` false, and true (the default)."""
KILLED = "kill -9, no notice"
"""The serving agent SIGKILLed instead of warned (through the make-before-break gateway)."""
MODES = (TODAY, EARLY, KILLED)
MODE_FLAGS = {"today": TODAY, "early": EARLY, "kill": KILLED}
"""`--modes`: today's move and make-before-break on a notice, and a kill without one."""
# The notice comes once the reply runs at its pace, and its deadline leaves the drain
# MOVE_WINDOW_SECONDS (more for a longer conversation: `move_window_seconds`) before its
# margin: enough for the next agent's prefill (an ~8,000-token conversation, ~1 s here) and
# its warming rounds, too little for the rest of the reply (checked at the notice).
NOTICE_AFTER_TOKENS = 40
MOVE_WINDOW_SECONDS = 6.0
WINDOW_CONTEXT_TOKENS = 8000
IMDS_POLL_SECONDS = 0.2
AGENT_IMDS_POLL_SECONDS: float = AgentSettings.model_fields["imds_poll_seconds"].default
"""How often a deployed agent polls IMDS: the bench's agents do too, given AWS's notice."""
# The reply's rest must take this many times the window at the notice: the drain's rate
# estimate then finds it late for sure.
LATE_FACTOR = 1.25
AFTER_SWITCH_DELTAS = 10
"""How far past the switch the move's gap is looked for: the next agent's first deltas."""
EARLY_MOVES = "spotgate_gateway_early_moves_total"
EARLY_DIVERGENCES = "spotgate_gateway_early_move_divergences_total"
EARLY_CHECKED = "spotgate_gateway_early_move_checked_tokens_total"
RESUMES = "spotgate_gateway_resumes_total"
GATEWAY_COUNTERS = (EARLY_MOVES, EARLY_DIVERGENCES, EARLY_CHECKED, RESUMES)
AGENT_TTFT = "spotgate_agent_ttft_seconds"
ACTIVE_STREAMS = "spotgate_agent_active_streams"
AGENT_EXIT_SECONDS = 120.0
STREAM_TIMEOUT_SECONDS = 300.0
STREAM_TIMEOUT_SECONDS_PER_TOKEN = 0.1
"""A long reply's decode slows as its context grows: its stream gets this long per token.

A bound against a hang, not a pace: from 8,000 tokens of context on two cores a token takes
about 30 ms (12,000 tokens of reply past 360 s)."""
CONVERSATION_TURN_WORDS = 300


@dataclass
class StreamRecord:
    """What the client saw of one stream: arrivals, agents, ids, and the notice."""

    delta_times: list[float] = field(default_factory=list)  # perf_counter at each delta
    delta_tokens: list[int] = field(default_factory=list)  # tokens each delta carried
    ids: list[int] = field(default_factory=list)
    starts: list[tuple[float, str, int]] = field(default_factory=list)  # (time, agent, held)
    sent_at: float = 0.0  # the `generate` sent
    notice_at: float | None = None
    served_by: str | None = None  # the agent that got the notice
    notice_in_seconds: float = 0.0
    prompt_tokens: int = 0
    done_at: float = 0.0
    error: str | None = None

    @property
    def reply_seconds(self) -> float:
        """From the first delta to `done`: the reply at its pace, its first prefill apart."""
        return self.done_at - self.delta_times[0]


@dataclass(frozen=True)
class MoveFigures:
    """One moved stream's timing, in seconds, and where its switch fell."""

    median_gap: float  # before the notice: the stream's own pace
    move_gap: float  # the largest gap from the notice to AFTER_SWITCH_DELTAS after the switch
    warming_gap: float  # the largest from the notice to the switch (the draining agent's)
    after_gap: float  # the largest after the switch's (the next agent's)
    notice_to_switch: float  # the notice posted → the next agent's `start`
    last_delta_to_start: float  # the draining agent's last delta relayed → that `start`
    continuation_ttft: float  # that `start` → the next agent's first delta
    switched_at: int  # tokens the client held at the switch
    deltas: int
    multi_token_deltas: int
    reply_seconds: float  # the first delta → `done`
    window: tuple[int, int]  # the last token before the notice, and the move gap's last one
    window_seconds: float  # from the one's arrival to the other's

    @property
    def ratio(self) -> float:
        """The move's gap over the stream's median gap."""
        return self.move_gap / self.median_gap


def move_figures(record: StreamRecord) -> MoveFigures:
    """The gaps of a stream between consecutive deltas (each delta one arrival, whatever its n)."""
    times = record.delta_times
    if len(times) < 3 or record.notice_at is None or len(record.starts) < 2:
        raise ValueError("a moved stream needs a notice, a second `start` and three deltas")
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    switch, _agent, held = record.starts[1]
    before = [t for t in times if t < switch]
    after = [t for t in times if t > switch]
    if not before or not after:
        raise ValueError("the second `start` came before the first delta or after the last")
    move_ends = after[min(AFTER_SWITCH_DELTAS, len(after)) - 1]
    pairs = list(zip(gaps, times[1:], strict=True))
    own = [g for g, end in pairs if end <= record.notice_at]
    if not own:
        raise ValueError("a moved stream needs deltas before its notice")
    moving = [g for g, end in pairs if record.notice_at < end <= move_ends]
    arrivals = token_arrivals(record)
    window = (
        sum(1 for at in arrivals if at <= record.notice_at) - 1,
        sum(1 for at in arrivals if at <= move_ends) - 1,
    )
    return MoveFigures(
        median_gap=median(own),
        move_gap=max(moving, default=0.0),
        warming_gap=max((g for g, end in pairs if record.notice_at < end < switch), default=0.0),
        after_gap=max((g for g, end in pairs if end > after[0]), default=0.0),
        notice_to_switch=switch - record.notice_at,
        last_delta_to_start=switch - before[-1],
        continuation_ttft=after[0] - switch,
        switched_at=held,
        deltas=len(times),
        multi_token_deltas=sum(1 for n in record.delta_tokens if n > 1),
        reply_seconds=record.reply_seconds,
        window=window,
        window_seconds=window_seconds(record, window),
    )


def window_seconds(record: StreamRecord, window: tuple[int, int]) -> float:
    """The time between the arrivals of a window's two tokens."""
    arrivals = token_arrivals(record)
    return arrivals[window[1]] - arrivals[window[0]]


def token_arrivals(record: StreamRecord) -> list[float]:
    """When each token of the reply reached the client (those of one delta, together)."""
    deltas = zip(record.delta_times, record.delta_tokens, strict=True)
    return [at for at, tokens in deltas for _ in range(tokens)]


def first_difference(moved: Sequence[int], reference: Sequence[int]) -> int | None:
    """Where two replies' ids first differ (None: equal)."""
    for index, (a, b) in enumerate(zip(moved, reference, strict=False)):
        if a != b:
            return index
    return None if len(moved) == len(reference) else min(len(moved), len(reference))


def stream_timeout_seconds(reply_tokens: int) -> float:
    """How long a stream of `reply_tokens` may take before the run fails."""
    return max(STREAM_TIMEOUT_SECONDS, reply_tokens * STREAM_TIMEOUT_SECONDS_PER_TOKEN)


def imds_poll_seconds(notice_seconds: float | None) -> float:
    """How often the agents poll IMDS: as deployed with AWS's notice, else the bench's own."""
    return IMDS_POLL_SECONDS if notice_seconds is None else AGENT_IMDS_POLL_SECONDS


def move_window_seconds(
    prompt_tokens: int, notice_seconds: float | None = None, margin_seconds: float = 0.0
) -> float:
    """The move's window before the drain's margin: MOVE_WINDOW_SECONDS per 8,000 tokens.

    With `notice_seconds` (AWS gives 120), all the notice but the drain's margin.
    """
    if notice_seconds is not None:
        return notice_seconds - margin_seconds
    return MOVE_WINDOW_SECONDS * max(1.0, prompt_tokens / WINDOW_CONTEXT_TOKENS)


def notice_deadline_seconds(window_seconds: float, margin_seconds: float) -> float:
    """The notice's `in_seconds`: the drain's margin plus the window the move has before it."""
    return margin_seconds + window_seconds


@dataclass(frozen=True)
class MoveRun:
    """One run of one gateway."""

    mode: str
    context: int  # the prompt tokens asked for
    figures: MoveFigures
    differs_at: int | None  # first difference from the unmoved reply (None: equal)
    reply_tokens: int
    prompt_tokens: int
    counters: dict[str, float]  # the gateway's counters' increase over the run
    next_agent_queried: float  # prompt tokens the next agent looked up in its prefix cache
    next_agent_hit: float  # and found there
    next_agent_streams: float  # streams the next agent started (its TTFT histogram's count)
    next_agent_ttft_sum: float  # their TTFTs, summed (s)
    reference_seconds: float  # the unmoved reply's first delta → `done`
    reference_window_seconds: float  # the unmoved reply's time over the move's window's tokens

    @property
    def lost_gaps(self) -> float:
        """The time the move cost the reply, in its median gaps: its window, against unmoved."""
        return (
            self.figures.window_seconds - self.reference_window_seconds
        ) / self.figures.median_gap

    @property
    def reply_over_unmoved(self) -> float:
        """How much longer the moved reply took than its unmoved run, in its median gaps."""
        return (self.figures.reply_seconds - self.reference_seconds) / self.figures.median_gap

    @property
    def prefilled_tokens(self) -> float:
        """Tokens the next agent prefilled: those it looked up, less its cache's hits."""
        return self.next_agent_queried - self.next_agent_hit
