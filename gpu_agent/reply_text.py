"""A reply's text on its way to the client: cut at stop strings, told apart as it streams.

Both are pure over the text so far, so a stream that moved goes on exactly where its
client is: `StopFilter` from the text the client holds, `ReplyReader` likewise.
"""

from __future__ import annotations

from gpu_agent.reasoning import ReplyReasoning
from gpu_agent.tool_calls import ReplyContent, ToolCallReader
from spotgate.protocol import ToolCall


def _find_stop(text: str, stops: list[str]) -> int | None:
    """Index in `text` where the earliest stop string starts."""
    found = [index for stop in stops if (index := text.find(stop)) >= 0]
    return min(found) if found else None


def _last(text: str, chars: int) -> str:
    return text[max(0, len(text) - chars) :] if chars else ""


class StopFilter:
    """Text on its way to the client, cut before the first stop string.

    Text that may be the start of a stop string is held back until what follows settles it.
    Only that much sent text is kept (a stop string may begin in it after a resume), so a
    step costs the same however long the stream is.
    """

    def __init__(self, stops: list[str], sent: str) -> None:
        self.stops = [stop for stop in stops if stop]
        self.holdback = max((len(stop) for stop in self.stops), default=1) - 1
        self._sent_tail = _last(sent, self.holdback)
        self._unsent = ""
        self.stopped = False

    def feed(self, text: str, final: bool) -> str:
        """Add decoded text; return what may go to the client now (`stopped` once cut)."""
        window = self._sent_tail + self._unsent + text
        seen = len(self._sent_tail)
        stop_at = _find_stop(window, self.stops) if self.stops else None
        if stop_at is not None:
            self.stopped = True
            end = max(seen, stop_at)
        elif final:
            end = len(window)
        else:
            end = max(seen, len(window) - self.holdback)
        out = window[seen:end]
        kept = window[:end]
        self._sent_tail = _last(kept, self.holdback)
        self._unsent = window[end:]
        return out


ReplyParts = tuple[str | None, str | None]
"""What a delta adds to the reply's content and to its thinking (None: not told apart)."""


class ReplyReader:
    """A reply's text told apart as it streams: thinking, content, tool-call markup.

    Thinking comes first (`gpu_agent.reasoning`); what follows it is content, in which the
    calls the model makes of its own accord are markup (`gpu_agent.tool_calls`). Both are
    pure functions of the text so far, so a reader started from a moved stream's text goes on
    exactly where the client is.
    """

    def __init__(
        self,
        reasoning: ReplyReasoning | None,
        tools: ToolCallReader | None,
        text: str,
        *,
        show_reasoning: bool,
    ) -> None:
        self._reasoning = reasoning
        self._tools = tools
        self._show_reasoning = show_reasoning
        answer = text if reasoning is None else reasoning.initial_answer
        self._content = ReplyContent(tools.markers, answer) if tools is not None else None

    @property
    def reasons(self) -> bool:
        """Whether the reply's thinking is told from its answer."""
        return self._reasoning is not None

    @property
    def splits(self) -> bool:
        """Whether deltas say what is content (else all their text is)."""
        return self._reasoning is not None or self._tools is not None

    def feed(self, text: str) -> ReplyParts:
        """What `text`, appended to the reply, adds to its content and thinking."""
        if not self.splits:
            return None, None
        if self._reasoning is None:
            return self._answer(text), None
        thinking, answer = self._reasoning.feed(text)
        return self._answer(answer), self._shown(thinking)

    def finish(self) -> tuple[ReplyParts, list[ToolCall] | None]:
        """What the whole reply still adds (held back), and the calls it made, if any."""
        thinking, answer = self._reasoning.finish() if self._reasoning is not None else ("", "")
        content = self._answer(answer) if self.splits else None
        calls = None
        if self._tools is not None and self._content is not None:
            parsed = self._tools.read(self._content.text)
            calls = parsed.calls or None
            content = (content or "") + self._content.finish(parsed.content)
        return (content, self._shown(thinking) if self._reasoning is not None else None), calls

    def _answer(self, text: str) -> str:
        return self._content.feed(text) if self._content is not None else text

    def _shown(self, thinking: str) -> str:
        return thinking if self._show_reasoning else ""
