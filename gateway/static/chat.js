// The spotgate chat page: the websocket protocol of ARCHITECTURE.md with first-frame auth.
// Model text reaches the page only through markdown.js (sanitized) or as text nodes.

import { fitContext, learnReplyCount } from "./context.js";
import { copyButton, loadRenderer } from "./markdown.js";
import { ImportError, exportText, openStore, parseImport } from "./store.js";

const KEY_STORAGE = "spotgate.apiKey";
const RECONNECT_DELAYS_MS = [500, 1000, 2000, 5000, 10000];
const TOKEN_REFRESH_MARGIN_MS = 20000;

const $ = (id) => document.getElementById(id);
const state = {
  apiKey: localStorage.getItem(KEY_STORAGE),
  ws: null,
  reconnects: 0,
  refreshTimer: null,
  refreshing: null, // the token refresh in flight: a request waits for it
  renderer: null,
  store: null,
  chats: [],
  current: null,
  models: new Map(), // model id → max_model_len (null: not known yet)
  streaming: null, // {id, chat, request, message, view, started, firstAt, tokens, agent, ids, …}
  followScroll: true,
  autoScrolledTo: 0,
};

// --- start ------------------------------------------------------------------------------

async function start() {
  state.renderer = await loadRenderer();
  if (!state.renderer.markdown) {
    $("render-note").textContent = `Replies show as plain text: ${state.renderer.reason}.`;
    $("render-note").hidden = false;
  }
  try {
    state.store = await openStore();
    state.chats = await state.store.all();
  } catch (error) {
    notify(`Conversations cannot be kept in this browser (${error.message}); they last until the page closes.`);
  }
  state.current = state.chats[0] ?? null;
  renderChats();
  renderMessages();
  if (!state.apiKey) {
    const config = await fetch("/chat/config.json").then((r) => r.json()).catch(() => ({}));
    if (config.dev_api_key) state.apiKey = config.dev_api_key;
  }
  showKeyPanel();
  if (state.apiKey) await connect();
}

// --- key and token ----------------------------------------------------------------------

function showKeyPanel() {
  $("key-form").hidden = Boolean(state.apiKey);
  $("forget-key").hidden = !state.apiKey;
}

async function fetchToken() {
  const response = await fetch("/v1/token", {
    method: "POST",
    headers: { Authorization: `Bearer ${state.apiKey}` },
  });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const error = new Error(body.error?.message || `token request failed (${response.status})`);
    error.status = response.status;
    error.retryAfter = Number(response.headers.get("Retry-After")) || null;
    throw error;
  }
  return body;
}

/** The models the key may use, each with its context length (/v1/models). */
async function loadModels() {
  const response = await fetch("/v1/models", { headers: { Authorization: `Bearer ${state.apiKey}` } });
  if (!response.ok) return;
  const models = (await response.json()).data;
  state.models = new Map(models.map((model) => [model.id, model.max_model_len]));
  const select = $("model");
  const chosen = select.value;
  select.replaceChildren(...models.map((model) => new Option(model.id, model.id)));
  if (chosen && state.models.has(chosen)) select.value = chosen;
}

// --- socket -----------------------------------------------------------------------------

async function connect() {
  clearTimeout(state.refreshTimer);
  setConnection("connecting…");
  let issued;
  try {
    issued = await fetchToken();
  } catch (error) {
    if (error.status === 401) {
      notify(`The API key was refused: ${error.message}`);
      setConnection("offline");
      return;
    }
    return scheduleReconnect(error.message);
  }
  await loadModels();
  // The gateway that served this page: behind a load balancer its public URL, and locally
  // the very replica (every replica's token names the first one's URL).
  const ws = new WebSocket(new URL("/v1/ws", location.href.replace(/^http/, "ws")));
  state.ws = ws;
  ws.onopen = () => {
    ws.send(JSON.stringify({ type: "auth", token: issued.token }));
    state.reconnects = 0;
    setConnection("connected");
    hideNotice();
    scheduleTokenRefresh(issued.expires_at);
    if (state.streaming?.interrupted) resumeStream(ws);
  };
  ws.onmessage = (event) => onFrame(JSON.parse(event.data));
  ws.onclose = (event) => {
    if (state.ws !== ws) return;
    state.ws = null;
    if (event.code === 1008) {
      if (state.streaming) failStream("The connection dropped; the reply stopped here.");
      setConnection("offline");
      return; // refused credentials: reconnecting would be refused again
    }
    if (state.streaming) {
      // The reply goes on after reconnecting, from what the page already has.
      state.streaming.interrupted = true;
      state.streaming.view.meta.textContent = "connection lost; the reply resumes on reconnect…";
    }
    scheduleReconnect(`connection closed (${event.code})`);
  };
}

function resumeRequest(stream) {
  const resume = {
    token_ids: stream.ids,
    text: stream.text,
    completion_tokens: stream.ids.length,
    // Proof the gateway delivered these ids: without it they are charged again, as prompt.
    receipt: stream.receipt,
  };
  return stream.ids.length ? { ...stream.request, resume } : { ...stream.request, resume: undefined };
}

function resumeStream(ws) {
  const stream = state.streaming;
  stream.interrupted = false;
  ws.send(JSON.stringify(resumeRequest(stream)));
  stream.resuming = stream.ids.length > stream.continuedFrom; // said once the reply goes on
}

function sayResumed(stream) {
  stream.resuming = false;
  stream.message.moved = "the connection dropped mid-reply and it resumed; nothing was lost";
  note(stream.view, "moved", stream.message.moved);
}

function scheduleReconnect(reason) {
  const delay = RECONNECT_DELAYS_MS[Math.min(state.reconnects, RECONNECT_DELAYS_MS.length - 1)];
  state.reconnects += 1;
  setConnection(`reconnecting in ${Math.round(delay / 100) / 10} s (${reason})`);
  setTimeout(connect, delay);
}

function scheduleTokenRefresh(expiresAt) {
  const inMs = Math.max(1000, expiresAt * 1000 - Date.now() - TOKEN_REFRESH_MARGIN_MS);
  state.refreshTimer = setTimeout(() => {
    state.refreshing = refreshToken().finally(() => {
      state.refreshing = null;
    });
  }, inMs);
}

async function refreshToken() {
  try {
    const issued = await fetchToken();
    state.ws?.send(JSON.stringify({ type: "auth", token: issued.token }));
    scheduleTokenRefresh(issued.expires_at);
  } catch (error) {
    notify(`Could not refresh the session token: ${error.message}`);
  }
}

function setConnection(text) {
  $("connection").textContent = text;
}

// --- frames -----------------------------------------------------------------------------

function onFrame(frame) {
  const stream = state.streaming;
  if (frame.type === "error" && !frame.id) {
    notify(frame.message);
    return;
  }
  if (!stream || frame.id !== stream.id) return;
  if (frame.type === "queued") {
    // Positions count from 0 (next in line); people count from 1.
    // `eta_seconds`: the pool is booting an agent and expects it ready in about that long.
    const eta = frame.eta_seconds == null ? "" : `, ready in about ${Math.ceil(frame.eta_seconds)} s`;
    stream.view.meta.textContent = `queued: #${frame.position + 1} in line (the pool is scaling up${eta})`;
  } else if (frame.type === "start") {
    if (stream.agent && stream.agent !== frame.agent) {
      stream.message.moved = `moved from ${stream.agent} to ${frame.agent} mid-reply; nothing was lost`;
      note(stream.view, "moved", stream.message.moved);
    }
    stream.agent = frame.agent;
    stream.engine = frame.engine;
    stream.view.meta.textContent = `on ${frame.agent}…`;
  } else if (frame.type === "delta") {
    if (stream.resuming) sayResumed(stream);
    stream.firstAt ??= performance.now();
    stream.tokens += frame.n;
    stream.ids.push(...frame.ids);
    if (frame.receipt) stream.receipt = frame.receipt;
    stream.text += frame.text;
    // A model that reasons says which text is its thinking and which its answer.
    if (frame.reasoning) {
      stream.message.reasoning = (stream.message.reasoning ?? "") + frame.reasoning;
      showThinking(stream.view, stream.message.reasoning);
    }
    stream.message.content += frame.content ?? frame.text;
    stream.view.body.set(stream.message.content); // rendered on the next frame
  } else if (frame.type === "done") {
    if (stream.resuming) sayResumed(stream);
    finishStream(frame);
  } else if (frame.type === "error" && frame.code === "going_away") {
    // This gateway is stopping: reconnecting reaches another, which takes the reply on.
    state.ws?.close();
  } else if (frame.type === "error") {
    failStream(describeError(frame));
  }
}

function describeError(frame) {
  if (frame.code === "rate_limited") {
    return `Rate limited: ${frame.message}. Try again in ${Math.ceil(frame.retry_after ?? 1)} s.`;
  }
  if (frame.code === "no_capacity") {
    const wait = frame.retry_after ? ` Try again in ${Math.ceil(frame.retry_after)} s.` : "";
    return `No capacity right now: ${frame.message}.${wait}`;
  }
  if (frame.code === "unauthorized") return `Not authorized: ${frame.message}`;
  return `${frame.code}: ${frame.message}`;
}

function finishStream(done) {
  const stream = state.streaming;
  const { message } = stream;
  const seconds = (performance.now() - (stream.firstAt ?? stream.started)) / 1000;
  const ttft = ((stream.firstAt ?? performance.now()) - stream.started) / 1000;
  const rate = stream.tokens > 1 && seconds > 0 ? (stream.tokens - 1) / seconds : 0;
  const engine = stream.engine === "synthetic" ? " (synthetic engine)" : "";
  const ending = { cancelled: " · stopped", length: " · cut at the token limit" }[done.finish_reason] ?? "";
  message.meta =
    `${stream.agent ?? "?"}${engine} · TTFT ${ttft.toFixed(2)} s · ` +
    `${rate.toFixed(1)} tokens/s · ${stream.ids.length} tokens${ending}`;
  message.finish = done.finish_reason;
  learnReplyCount(message, stream.ids.length);
  // The ids go on with "Continue" (a resume: the model carries on exactly where it stopped).
  if (done.finish_reason === "length") {
    Object.assign(message, { ids: stream.ids, receipt: stream.receipt, text: stream.text });
  } else {
    delete message.ids;
    delete message.receipt;
    delete message.text;
  }
  stream.view.meta.textContent = message.meta;
  endStream();
}

function failStream(text) {
  const stream = state.streaming;
  stream.message.error = text;
  // A continuation that failed can be continued again from what it got.
  if (stream.continuedFrom > 0) {
    Object.assign(stream.message, { ids: stream.ids, receipt: stream.receipt, text: stream.text });
  }
  stream.view.meta.textContent = "";
  stream.view.meta.append(errorNode(text));
  endStream();
}

function endStream() {
  const stream = state.streaming;
  stream.view.body.flush();
  state.streaming = null;
  $("stop").hidden = true;
  $("send").hidden = false;
  save(stream.chat);
  renderActions();
}

// --- sending ----------------------------------------------------------------------------

async function ready() {
  // Sent while the token is being renewed, a request would go out under the old one (which
  // may have just expired: a machine that slept, a slow network); the new one comes first.
  if (state.refreshing) await state.refreshing;
  if (!state.ws || state.ws.readyState !== WebSocket.OPEN) {
    notify("Not connected yet; wait a moment and send again.");
    return false;
  }
  // A model scaling from zero has no context length until an agent says: ask again.
  if (state.models.get($("model").value) == null) await loadModels();
  return !state.streaming;
}

async function send(text) {
  if (!(await ready())) return;
  const chat = state.current ?? newChat($("system").value);
  const question = { role: "user", content: text };
  const reply = { role: "assistant", content: "" };
  chat.messages.push(question, reply);
  if (chat.title === "New chat") chat.title = text.replace(/\s+/g, " ").trim().slice(0, 40);
  renderChats();
  state.followScroll = true; // what was just sent, and its reply, come into view
  appendMessages(question, reply);
  generate(chat, reply);
}

/** Ask for `reply` again: the same conversation up to it, a fresh answer. */
async function regenerate(chat, reply) {
  if (!(await ready())) return;
  for (const field of ["content", "reasoning", "text", "meta", "error", "moved", "trimmed", "finish", "ids", "receipt", "tokens"]) {
    delete reply[field];
  }
  reply.content = "";
  const old = reply.view.root;
  old.replaceWith(messageView(reply));
  generate(chat, reply);
}

/** Let a reply cut at the token limit go on: a resume from the ids it came as. */
async function continueReply(chat, reply) {
  if (!(await ready())) return;
  delete reply.error;
  reply.view.meta.textContent = "";
  generate(chat, reply, reply.ids ?? [], reply.receipt);
}

function generate(chat, reply, continuing = [], receipt = undefined) {
  const model = $("model").value;
  const maxModelLen = state.models.get(model) ?? null;
  const maxTokens = Number($("max-tokens").value) || 256;
  const history = chat.messages.slice(0, chat.messages.indexOf(reply));
  if (chat.countsModel !== model) {
    // Replies' token counts from another model (another tokenizer) do not hold for this one.
    for (const message of chat.messages) delete message.tokens;
    chat.countsModel = model;
  }
  chat.system = $("system").value;
  const system = chat.system ? { role: "system", content: chat.system } : null;
  const completionTokens = continuing.length + maxTokens;
  const fit = fitContext({ system, history, maxModelLen, completionTokens });
  reply.trimmed = fit.dropped
    ? `The oldest ${fit.dropped} message${fit.dropped > 1 ? "s were" : " was"} left out to fit ` +
      `${model}'s context of ${maxModelLen} tokens (this prompt: at most about ${fit.tokens}).`
    : undefined;
  note(reply.view, "trimmed", reply.trimmed);
  chat.updated = Date.now();
  if (state.chats[0] !== chat) {
    state.chats = [chat, ...state.chats.filter((other) => other !== chat)]; // most recent first
    renderChats();
  }
  const id = crypto.randomUUID();
  // Token ids come with the text (`want_ids`): what the page holds resumes a dropped stream.
  const request = {
    type: "generate",
    id,
    model,
    messages: fit.messages.map(({ role, content }) => ({ role, content })),
    max_tokens: completionTokens,
    temperature: Number($("temperature").value),
    session: chat.session,
    want_ids: true,
  };
  const stream = {
    id, chat, request, message: reply, view: reply.view,
    started: performance.now(), tokens: 0, agent: null, ids: [...continuing], receipt,
    continuedFrom: continuing.length, interrupted: false,
    // All the model wrote, thinking and its tags included: what a resume continues after.
    text: continuing.length ? reply.text ?? reply.content : "",
  };
  state.streaming = stream;
  $("stop").hidden = false;
  $("send").hidden = true;
  renderActions();
  state.ws.send(JSON.stringify(resumeRequest(stream)));
}

function stop() {
  if (state.streaming?.interrupted) {
    endStream(); // nothing runs anywhere until the page resumes it: keep what came
    return;
  }
  if (state.streaming && state.ws) {
    state.ws.send(JSON.stringify({ type: "cancel", id: state.streaming.id }));
  }
}

// --- conversations ----------------------------------------------------------------------

function newChat(system = "") {
  const now = Date.now();
  const chat = {
    id: crypto.randomUUID(), session: crypto.randomUUID(), title: "New chat",
    system, created: now, updated: now, messages: [],
  };
  state.chats.unshift(chat);
  state.current = chat;
  save(chat);
  renderChats();
  renderMessages();
  return chat;
}

function save(chat) {
  state.store?.put(chat).catch((error) => notify(`Could not save the conversation: ${error.message}`));
}

function openChat(chat) {
  if (state.streaming) return;
  state.current = chat;
  document.body.classList.remove("sidebar-open");
  renderChats();
  renderMessages();
}

function renameChat(chat, item) {
  const input = document.createElement("input");
  input.className = "rename-input";
  input.value = chat.title;
  input.setAttribute("aria-label", "Conversation title");
  let finished = false;
  const finish = (keep) => {
    if (finished) return;
    finished = true;
    if (keep && input.value.trim()) {
      chat.title = input.value.trim().slice(0, 200);
      save(chat);
    }
    renderChats();
    document.querySelector(`#chats [data-id="${CSS.escape(chat.id)}"] .rename`)?.focus();
  };
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter") {
      event.preventDefault();
      finish(true);
    } else if (event.key === "Escape") {
      event.preventDefault();
      event.stopPropagation();
      finish(false);
    }
  });
  input.addEventListener("blur", () => finish(true));
  item.querySelector(".open").replaceWith(input);
  input.focus();
  input.select();
}

async function deleteChat(chat) {
  if (state.streaming?.chat === chat) return;
  if (!confirm(`Delete the conversation “${chat.title}”?`)) return;
  try {
    await state.store?.delete(chat.id);
  } catch (error) {
    notify(`Could not delete the conversation: ${error.message}`);
    return;
  }
  state.chats = state.chats.filter((other) => other !== chat);
  if (state.current === chat) {
    state.current = state.chats[0] ?? null;
    renderMessages();
  }
  renderChats();
  $("new-chat").focus();
}

function matches(chat, query) {
  if (!query) return true;
  const has = (text) => (text ?? "").toLowerCase().includes(query);
  return has(chat.title) || has(chat.system) || chat.messages.some((message) => has(message.content));
}

function renderChats() {
  const query = $("search").value.trim().toLowerCase();
  const shown = state.chats.filter((chat) => matches(chat, query));
  $("chats").replaceChildren(...shown.map((chat) => {
    const item = document.createElement("li");
    item.dataset.id = chat.id;
    item.setAttribute("aria-current", String(chat === state.current));
    const open = button("open", chat.title, () => openChat(chat));
    open.title = chat.title;
    const rename = button("rename", "✎", () => renameChat(chat, item));
    rename.setAttribute("aria-label", `Rename “${chat.title}”`);
    rename.title = "Rename";
    const remove = button("delete", "✕", () => deleteChat(chat));
    remove.setAttribute("aria-label", `Delete “${chat.title}”`);
    remove.title = "Delete";
    item.append(open, rename, remove);
    return item;
  }));
  $("no-match").hidden = !query || shown.length > 0;
}

function exportChats() {
  const blob = new Blob([exportText(state.chats)], { type: "application/json" });
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = `spotgate-chats-${new Date().toISOString().slice(0, 10)}.json`;
  link.click();
  setTimeout(() => URL.revokeObjectURL(link.href), 10000);
}

async function importChats(file) {
  if (state.streaming) {
    notify("A reply is streaming: import once it ends.");
    return;
  }
  let chats;
  try {
    chats = parseImport(await file.text());
  } catch (error) {
    if (!(error instanceof ImportError)) throw error;
    notify(`Could not import ${file.name}: ${error.message}. Nothing was imported.`);
    return;
  }
  try {
    await state.store?.put(...chats);
  } catch (error) {
    notify(`Could not import ${file.name}: ${error.message}`);
    return;
  }
  const imported = new Set(chats.map((chat) => chat.id));
  state.chats = [...chats, ...state.chats.filter((chat) => !imported.has(chat.id))];
  state.chats.sort((a, b) => b.updated - a.updated);
  if (!state.current || imported.has(state.current.id)) state.current = chats[0] ?? state.current;
  renderChats();
  renderMessages();
  notify(`Imported ${chats.length} conversation${chats.length === 1 ? "" : "s"} from ${file.name}.`, "info");
}

// --- messages ---------------------------------------------------------------------------

function renderMessages() {
  $("system").value = state.current?.system ?? "";
  if (state.current?.system) $("system-panel").open = true;
  $("messages").replaceChildren(...(state.current?.messages ?? []).map(messageView));
  renderActions();
  state.followScroll = true; // a freshly shown conversation opens at its end
  state.autoScrolledTo = 0;
  scrollIfFollowing();
}

/** Show messages added at the end of the conversation (the rest stays as it is). */
function appendMessages(...messages) {
  $("messages").append(...messages.map(messageView));
  renderActions();
  scrollIfFollowing();
}

/** A reasoning model's thinking, above its answer, folded away once read. */
function showThinking(view, text) {
  if (!view.thinking) {
    const details = document.createElement("details");
    details.className = "thinking";
    const summary = document.createElement("summary");
    summary.textContent = "Thinking";
    view.thinking = document.createElement("div");
    details.append(summary, view.thinking);
    view.root.prepend(details);
  }
  view.thinking.textContent = text;
}

function messageView(message) {
  const root = document.createElement("article");
  root.className = `message ${message.role}`;
  const bodyNode = document.createElement("div");
  bodyNode.className = "body";
  const meta = document.createElement("div");
  meta.className = "meta";
  const actions = document.createElement("div");
  actions.className = "actions";
  root.append(bodyNode, meta, actions);
  const view = { root, meta, actions };
  if (message.role === "assistant") {
    view.body = state.renderer.view(bodyNode);
    if (message.content) {
      view.body.set(message.content);
      view.body.flush();
    }
    view.body.onRender = scrollIfFollowing;
  } else {
    bodyNode.classList.add("plain");
    bodyNode.textContent = message.content;
  }
  message.view = view;
  if (message.reasoning) showThinking(view, message.reasoning);
  if (message.moved) note(view, "moved", message.moved);
  if (message.trimmed) note(view, "trimmed", message.trimmed);
  if (message.error) meta.append(errorNode(message.error));
  else if (message.meta) meta.textContent = message.meta;
  return root;
}

/** The buttons under each reply: copy it; regenerate or continue the last one. */
function renderActions() {
  const chat = state.current;
  const messages = chat?.messages ?? [];
  const last = messages.at(-1);
  for (const message of messages) {
    if (message.role !== "assistant" || !message.view) continue;
    const streaming = state.streaming?.message === message;
    const buttons = [];
    if (!streaming && message.content) {
      buttons.push(copyButton(() => message.content, "Copy reply"));
      buttons.at(-1).className = "copy-reply";
    }
    if (!streaming && !state.streaming && message === last) {
      if (message.finish === "length" && message.ids?.length) {
        buttons.push(button("continue", "Continue", () => continueReply(chat, message)));
      }
      buttons.push(button("regenerate", "Regenerate", () => regenerate(chat, message)));
    }
    message.view.actions.replaceChildren(...buttons);
  }
}

function note(view, kind, text) {
  let node = view.root.querySelector(`:scope > .${kind}`);
  if (!text) {
    node?.remove();
    return;
  }
  if (!node) {
    node = document.createElement("div");
    node.className = kind;
    view.root.insertBefore(node, view.meta);
  }
  node.textContent = text;
}

function button(className, text, onclick) {
  const node = document.createElement("button");
  node.type = "button";
  node.className = className;
  node.textContent = text;
  node.onclick = onclick;
  return node;
}

function errorNode(text) {
  const node = document.createElement("span");
  node.className = "error";
  node.textContent = text;
  return node;
}

function notify(text, kind = "error") {
  $("notice").textContent = text;
  $("notice").className = kind;
  $("notice").setAttribute("role", kind === "error" ? "alert" : "status");
  $("notice").hidden = false;
}

function hideNotice() {
  $("notice").hidden = true;
}

function scrollIfFollowing() {
  const box = $("messages");
  // Scroll events arrive a frame late: a user who scrolled up since our last scroll shows
  // first as a position above it, and must not be pulled back down by the next token.
  if (box.scrollTop + 2 < state.autoScrolledTo) state.followScroll = false;
  if (!state.followScroll) return;
  box.scrollTop = box.scrollHeight;
  state.autoScrolledTo = box.scrollTop;
}

// --- wiring -----------------------------------------------------------------------------

$("messages").addEventListener("scroll", () => {
  const box = $("messages");
  state.followScroll = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
});
$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("prompt").value;
  if (!text.trim()) return;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && state.streaming) {
    event.preventDefault();
    stop();
  }
});
$("stop").addEventListener("click", stop);
$("new-chat").addEventListener("click", () => !state.streaming && newChat());
$("search").addEventListener("input", renderChats);
$("system").addEventListener("change", () => {
  if (!state.current || state.current.system === $("system").value) return;
  state.current.system = $("system").value;
  save(state.current);
});
$("export").addEventListener("click", exportChats);
$("import").addEventListener("click", () => $("import-file").click());
$("import-file").addEventListener("change", async () => {
  const [file] = $("import-file").files;
  $("import-file").value = "";
  if (file) await importChats(file);
});
$("toggle-sidebar").addEventListener("click", () => document.body.classList.toggle("sidebar-open"));
$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  state.apiKey = $("key-input").value.trim();
  localStorage.setItem(KEY_STORAGE, state.apiKey);
  $("key-input").value = "";
  hideNotice();
  showKeyPanel();
  state.ws?.close();
  connect();
});
$("forget-key").addEventListener("click", () => {
  localStorage.removeItem(KEY_STORAGE);
  state.apiKey = null;
  state.ws?.close();
  state.ws = null;
  setConnection("offline");
  showKeyPanel();
});

start();
