// Conversations in the browser's IndexedDB (one record per conversation), their export to a
// JSON file and their import from one, checked field by field.

const DB_NAME = "spotgate";
const DB_VERSION = 1;
const CHATS = "chats";
const LEGACY_STORAGE = "spotgate.chats"; // where conversations lived before (localStorage)
export const EXPORT_FORMAT = "spotgate.chats";
export const EXPORT_VERSION = 1;

const done = (request) =>
  new Promise((resolve, reject) => {
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
const committed = (transaction) =>
  new Promise((resolve, reject) => {
    transaction.oncomplete = () => resolve();
    transaction.onerror = transaction.onabort = () => reject(transaction.error);
  });

/** The conversation store, with any conversations left in localStorage moved into it once. */
export async function openStore() {
  const open = indexedDB.open(DB_NAME, DB_VERSION);
  open.onupgradeneeded = () => open.result.createObjectStore(CHATS, { keyPath: "id" });
  const db = await done(open);
  const store = {
    async all() {
      const chats = await done(db.transaction(CHATS).objectStore(CHATS).getAll());
      return chats.sort((a, b) => (b.updated ?? 0) - (a.updated ?? 0));
    },
    async put(...chats) {
      const transaction = db.transaction(CHATS, "readwrite");
      for (const chat of chats) transaction.objectStore(CHATS).put(plain(chat));
      await committed(transaction);
    },
    async delete(id) {
      const transaction = db.transaction(CHATS, "readwrite");
      transaction.objectStore(CHATS).delete(id);
      await committed(transaction);
    },
  };
  await migrate(store);
  return store;
}

async function migrate(store) {
  const legacy = localStorage.getItem(LEGACY_STORAGE);
  if (legacy === null) return;
  let chats = [];
  try {
    // Oldest last there; each gets a time that keeps that order.
    const now = Date.now();
    chats = JSON.parse(legacy).map((chat, index) => checkChat(chat, `[${index}]`, now - index));
  } catch (error) {
    console.warn(`spotgate: conversations in localStorage not moved: ${error.message}`);
    return; // left where they are, for a later page to try again
  }
  await store.put(...chats);
  localStorage.removeItem(LEGACY_STORAGE); // only once they are safely in IndexedDB
}

/** A conversation as stored and exported: its messages without the page's views. */
export function plain(chat) {
  return { ...chat, messages: chat.messages.map(({ view, ...message }) => message) };
}

/** The export file's text. */
export function exportText(chats) {
  const body = {
    format: EXPORT_FORMAT,
    version: EXPORT_VERSION,
    exported_at: new Date().toISOString(),
    chats: chats.map(plain),
  };
  return JSON.stringify(body, null, 2);
}

export class ImportError extends Error {}

/** The conversations in an export file's text; ImportError says what is wrong with it. */
export function parseImport(text) {
  let body;
  try {
    body = JSON.parse(text);
  } catch (error) {
    throw new ImportError(`it is not JSON (${error.message})`);
  }
  if (!isObject(body) || body.format !== EXPORT_FORMAT) {
    throw new ImportError(`it is not a spotgate conversations file (no "format": "${EXPORT_FORMAT}")`);
  }
  if (body.version !== EXPORT_VERSION) {
    throw new ImportError(`its version ${JSON.stringify(body.version)} is not ${EXPORT_VERSION}`);
  }
  if (!Array.isArray(body.chats)) throw new ImportError('"chats" must be a list');
  const now = Date.now();
  return body.chats.map((chat, index) => checkChat(chat, `chats[${index}]`, now - index));
}

const ROLES = ["user", "assistant"];
const TEXT_FIELDS = ["reasoning", "meta", "error", "moved", "trimmed", "finish", "receipt"];

function checkChat(chat, where, updated) {
  if (!isObject(chat)) throw new ImportError(`${where} must be an object`);
  const text = (value, field, fallback) => {
    if (value === undefined || value === null) return fallback;
    if (typeof value !== "string") throw new ImportError(`${where}.${field} must be text`);
    return value;
  };
  if (!Array.isArray(chat.messages)) throw new ImportError(`${where}.messages must be a list`);
  const checked = {
    id: text(chat.id, "id", null) || crypto.randomUUID(),
    session: text(chat.session, "session", null) || crypto.randomUUID(),
    title: text(chat.title, "title", "Imported chat").slice(0, 200),
    system: text(chat.system, "system", ""),
    created: Number.isFinite(chat.created) ? chat.created : updated,
    updated: Number.isFinite(chat.updated) ? chat.updated : updated,
    messages: chat.messages.map((message, index) => checkMessage(message, `${where}.messages[${index}]`)),
  };
  if (typeof chat.countsModel === "string") checked.countsModel = chat.countsModel; // whose counts
  return checked;
}

function checkMessage(message, where) {
  if (!isObject(message)) throw new ImportError(`${where} must be an object`);
  if (!ROLES.includes(message.role)) {
    throw new ImportError(`${where}.role must be "user" or "assistant", not ${JSON.stringify(message.role)}`);
  }
  if (typeof message.content !== "string") throw new ImportError(`${where}.content must be text`);
  const checked = { role: message.role, content: message.content };
  for (const field of TEXT_FIELDS) {
    if (message[field] === undefined || message[field] === null) continue;
    if (typeof message[field] !== "string") throw new ImportError(`${where}.${field} must be text`);
    checked[field] = message[field];
  }
  if (Number.isInteger(message.tokens) && message.tokens > 0) checked.tokens = message.tokens;
  if (message.ids !== undefined) {
    if (!Array.isArray(message.ids) || !message.ids.every((id) => Number.isInteger(id) && id >= 0)) {
      throw new ImportError(`${where}.ids must be a list of token ids`);
    }
    checked.ids = message.ids;
  }
  return checked;
}

function isObject(value) {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
