// The spotgate chat page: the websocket protocol of DESIGN.md §4 with first-frame auth.
// Model text is only ever put into the page as text nodes, never as HTML.

const KEY_STORAGE = "spotgate.apiKey";
const CHATS_STORAGE = "spotgate.chats";
const RECONNECT_DELAYS_MS = [500, 1000, 2000, 5000, 10000];
const TOKEN_REFRESH_MARGIN_MS = 20000;

const $ = (id) => document.getElementById(id);
const state = {
  apiKey: localStorage.getItem(KEY_STORAGE),
  ws: null,
  reconnects: 0,
  refreshTimer: null,
  refreshing: null, // the token refresh in flight: a request waits for it
  chats: JSON.parse(localStorage.getItem(CHATS_STORAGE) || "[]"),
  current: null,
  streaming: null, // {id, chat, message, view, started, firstAt, tokens, agent}
  followScroll: true,
  autoScrolledTo: 0,
};

// --- key and token ----------------------------------------------------------------------

async function start() {
  if (!state.apiKey) {
    const config = await fetch("/chat/config.json").then((r) => r.json()).catch(() => ({}));
    if (config.dev_api_key) state.apiKey = config.dev_api_key;
  }
  showKeyPanel();
  renderChats();
  if (state.apiKey) await connect();
}

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

async function loadModels() {
  const response = await fetch("/v1/models", { headers: { Authorization: `Bearer ${state.apiKey}` } });
  if (!response.ok) return;
  const select = $("model");
  const chosen = select.value;
  select.replaceChildren(
    ...(await response.json()).data.map((model) => new Option(model.id, model.id)),
  );
  if (chosen) select.value = chosen;
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

function resumeStream(ws) {
  const stream = state.streaming;
  stream.interrupted = false;
  const resume = {
    token_ids: stream.ids,
    text: stream.message.content,
    completion_tokens: stream.ids.length,
  };
  ws.send(JSON.stringify(stream.ids.length ? { ...stream.request, resume } : stream.request));
  stream.resuming = stream.ids.length > 0; // said once the reply goes on (it may be refused)
}

function sayResumed(stream) {
  stream.resuming = false;
  const note = document.createElement("div");
  note.className = "moved";
  note.textContent = "the connection dropped mid-reply and it resumed; nothing was lost";
  stream.view.root.insertBefore(note, stream.view.meta);
  stream.message.moved = note.textContent;
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
      const moved = document.createElement("div");
      moved.className = "moved";
      moved.textContent = `moved from ${stream.agent} to ${frame.agent} mid-reply; nothing was lost`;
      stream.view.root.insertBefore(moved, stream.view.meta);
      stream.message.moved = moved.textContent;
    }
    stream.agent = frame.agent;
    stream.engine = frame.engine;
    stream.view.meta.textContent = `on ${frame.agent}…`;
  } else if (frame.type === "delta") {
    if (stream.resuming) sayResumed(stream);
    stream.firstAt ??= performance.now();
    stream.tokens += frame.n;
    stream.ids.push(...frame.ids);
    stream.message.content += frame.text;
    renderMarkdown(stream.view.body, stream.message.content);
    scrollIfFollowing();
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
  const seconds = (performance.now() - (stream.firstAt ?? stream.started)) / 1000;
  const ttft = ((stream.firstAt ?? performance.now()) - stream.started) / 1000;
  const rate = stream.tokens > 1 && seconds > 0 ? (stream.tokens - 1) / seconds : 0;
  const engine = stream.engine === "synthetic" ? " (synthetic engine)" : "";
  const stopped = done.finish_reason === "cancelled" ? " · stopped" : "";
  stream.message.meta =
    `${stream.agent ?? "?"}${engine} · TTFT ${ttft.toFixed(2)} s · ` +
    `${rate.toFixed(1)} tokens/s · ${done.usage.completion_tokens} tokens${stopped}`;
  stream.view.meta.textContent = stream.message.meta;
  endStream();
}

function failStream(text) {
  const stream = state.streaming;
  stream.message.error = text;
  stream.view.meta.textContent = "";
  stream.view.meta.append(errorNode(text));
  endStream();
}

function endStream() {
  state.streaming = null;
  $("stop").hidden = true;
  $("send").hidden = false;
  saveChats();
}

// --- sending ----------------------------------------------------------------------------

async function send(text) {
  // Sent while the token is being renewed, a request would go out under the old one (which
  // may have just expired: a machine that slept, a slow network); the new one comes first.
  if (state.refreshing) await state.refreshing;
  if (!state.ws || state.ws.readyState !== WebSocket.OPEN) {
    notify("Not connected yet; wait a moment and send again.");
    return;
  }
  if (state.streaming) return;
  const chat = state.current ?? newChat();
  chat.messages.push({ role: "user", content: text });
  if (chat.title === "New chat") chat.title = text.slice(0, 40);
  const reply = { role: "assistant", content: "" };
  const history = chat.messages.map(({ role, content }) => ({ role, content }));
  chat.messages.push(reply);
  renderChats();
  renderMessages();
  const id = crypto.randomUUID();
  // Token ids come with the text (`want_ids`): what the page holds resumes a dropped stream.
  const request = {
    type: "generate",
    id,
    model: $("model").value,
    messages: history,
    max_tokens: Number($("max-tokens").value) || 256,
    temperature: Number($("temperature").value),
    session: chat.session,
    want_ids: true,
  };
  state.streaming = {
    id, chat, request, message: reply, view: reply.view, started: performance.now(), tokens: 0,
    agent: null, ids: [], interrupted: false,
  };
  $("stop").hidden = false;
  $("send").hidden = true;
  state.ws.send(JSON.stringify(request));
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

function newChat() {
  const chat = { id: crypto.randomUUID(), session: crypto.randomUUID(), title: "New chat", messages: [] };
  state.chats.unshift(chat);
  state.current = chat;
  saveChats();
  renderChats();
  renderMessages();
  return chat;
}

function saveChats() {
  const plain = state.chats.map((chat) => ({
    ...chat,
    messages: chat.messages.map(({ view, ...message }) => message),
  }));
  localStorage.setItem(CHATS_STORAGE, JSON.stringify(plain));
}

function renderChats() {
  $("chats").replaceChildren(...state.chats.map((chat) => {
    const item = document.createElement("li");
    item.textContent = chat.title;
    item.setAttribute("aria-current", String(chat === state.current));
    item.tabIndex = 0;
    item.onclick = item.onkeydown = (event) => {
      if (event.type === "keydown" && event.key !== "Enter") return;
      if (state.streaming) return;
      state.current = chat;
      document.body.classList.remove("sidebar-open");
      renderChats();
      renderMessages();
    };
    return item;
  }));
}

function renderMessages() {
  const views = (state.current?.messages ?? []).map((message) => {
    const root = document.createElement("article");
    root.className = `message ${message.role}`;
    const body = document.createElement("div");
    body.className = "body";
    renderMarkdown(body, message.content);
    const meta = document.createElement("div");
    meta.className = "meta";
    root.append(body);
    if (message.moved) {
      const moved = document.createElement("div");
      moved.className = "moved";
      moved.textContent = message.moved;
      root.append(moved);
    }
    root.append(meta);
    if (message.error) meta.append(errorNode(message.error));
    else if (message.meta) meta.textContent = message.meta;
    message.view = { root, body, meta };
    return root;
  });
  $("messages").replaceChildren(...views);
  state.followScroll = true; // a freshly shown conversation opens at its end
  state.autoScrolledTo = 0;
  scrollIfFollowing();
}

// --- rendering (text nodes only) ---------------------------------------------------------

function renderMarkdown(container, text) {
  const nodes = [];
  const fence = /```([^\n`]*)\n([\s\S]*?)(?:```|$)/g;
  let last = 0;
  for (const match of text.matchAll(fence)) {
    nodes.push(...paragraphs(text.slice(last, match.index)));
    nodes.push(codeBlock(match[2], match[1].trim()));
    last = match.index + match[0].length;
  }
  nodes.push(...paragraphs(text.slice(last)));
  container.replaceChildren(...nodes);
}

function paragraphs(text) {
  return text.split(/\n{2,}/).filter((part) => part.trim()).map((part) => {
    const p = document.createElement("p");
    part.split(/(`[^`\n]+`)/).forEach((piece, index) => {
      if (index % 2 === 1) {
        const code = document.createElement("code");
        code.textContent = piece.slice(1, -1);
        p.append(code);
      } else {
        p.append(document.createTextNode(piece));
      }
    });
    return p;
  });
}

function codeBlock(source, language) {
  const wrapper = document.createElement("div");
  wrapper.className = "code";
  const pre = document.createElement("pre");
  const code = document.createElement("code");
  if (language) code.dataset.language = language;
  code.textContent = source;
  pre.append(code);
  const copy = document.createElement("button");
  copy.type = "button";
  copy.className = "copy";
  copy.textContent = "Copy";
  copy.onclick = async () => {
    await navigator.clipboard?.writeText(source);
    copy.textContent = "Copied";
  };
  wrapper.append(pre, copy);
  return wrapper;
}

function errorNode(text) {
  const node = document.createElement("span");
  node.className = "error";
  node.textContent = text;
  return node;
}

function notify(text) {
  $("notice").textContent = text;
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
$("stop").addEventListener("click", stop);
$("new-chat").addEventListener("click", () => !state.streaming && newChat());
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

state.current = state.chats[0] ?? null;
renderMessages();
start();
