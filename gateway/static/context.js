// Keeping a conversation within the model's context (`max_model_len`, from /v1/models).
//
// The page has no tokenizer, so it counts high. A reply counts the token ids it came as; any
// other message one token per UTF-8 byte of its text (no tokenizer spotgate serves makes
// more: byte-level BPE and byte-fallback SentencePiece tokens hold at least one byte each,
// so real prompts come out smaller, by about four times for English). Each message adds
// MESSAGE_OVERHEAD for the chat template's markers around it, the prompt PROMPT_OVERHEAD, and
// the page keeps a margin of the context free. The oldest turns go first, a whole turn
// (a user message and its reply) at a time; the system prompt always stays.
//
// A prompt's exact `usage.prompt_tokens` is not used to count its user messages lower: what
// it leaves after the replies' counts also holds the template's real overheads, so a user
// message given the rest could be counted below its share, and a later prompt made of
// other turns could then be sent too long.

export const MESSAGE_OVERHEAD = 16;
export const PROMPT_OVERHEAD = 16;
export const MARGIN = 0.02; // of the context, kept free

const encoder = new TextEncoder();

/** An upper bound on what `message` takes in a prompt. */
export function messageTokens(message) {
  if (Number.isInteger(message.tokens)) return message.tokens;
  return encoder.encode(message.content).length + MESSAGE_OVERHEAD;
}

/**
 * The messages to send: the system message (if any) and the newest turns that fit in
 * `maxModelLen` with `completionTokens` left for the reply. `history` is the conversation
 * before the reply, oldest first (it ends with a user message); `maxModelLen` null: all of it.
 * Returns {messages (the chat's message objects sent), dropped (how many left out), tokens}.
 */
export function fitContext({ system, history, maxModelLen, completionTokens }) {
  const head = system ? [system] : [];
  // Failed replies go too (empty): some chat templates insist that turns alternate.
  const sendable = history;
  const all = [...head, ...sendable];
  const total = (messages) => PROMPT_OVERHEAD + messages.reduce((sum, m) => sum + messageTokens(m), 0);
  if (!maxModelLen) return { messages: all, dropped: 0, tokens: total(all) };
  const budget = Math.floor(maxModelLen * (1 - MARGIN)) - completionTokens;
  // Turns start at user messages: the kept part starts at one, so nothing opens with a reply.
  const starts = sendable.flatMap((m, index) => (m.role === "user" ? [index] : []));
  let kept = sendable.slice(starts.at(-1) ?? 0); // the newest turn goes whatever it takes
  for (const start of starts.slice(0, -1).reverse()) {
    const candidate = sendable.slice(start);
    if (total([...head, ...candidate]) > budget) break;
    kept = candidate;
  }
  const messages = [...head, ...kept];
  return { messages, dropped: sendable.length - kept.length, tokens: total(messages) };
}

/** A finished reply's count: the token ids it came as, and the template's markers. */
export function learnReplyCount(reply, replyTokens) {
  reply.tokens = replyTokens + MESSAGE_OVERHEAD;
}
