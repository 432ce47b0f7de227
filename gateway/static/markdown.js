// Replies as Markdown: marked parses, highlight.js colours code, DOMPurify sanitizes every
// piece of HTML before it reaches the page. Raw HTML in the model's text is shown as text
// (escaped), never parsed; links keep only http(s) and mailto targets and open with
// rel="noopener noreferrer"; images become links (no request leaves the page on its own).
//
// The libraries are the ones the gateway lists as `<link rel="modulepreload" integrity>`
// (gateway/routes/chat_page.py): importing the same URL gets the checked module or fails.
// Without them the page shows replies as plain text, and says so.
//
// Streaming: each frame re-renders only the open end of the reply. Top-level blocks that
// later text can no longer change (see `settledLength`) are rendered once and kept.

const ALLOWED_TAGS = [
  "a", "blockquote", "br", "code", "del", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "input",
  "li", "ol", "p", "pre", "span", "strong", "sub", "sup", "table", "tbody", "td", "th", "thead",
  "tr", "ul",
];
const ALLOWED_ATTR = ["href", "title", "class", "align", "start", "type", "checked", "disabled"];
const SAFE_PROTOCOLS = new Set(["http:", "https:", "mailto:"]);

let loading = null;

/** The renderer: Markdown when the libraries load, else plain text (`reason` says why). */
export function loadRenderer() {
  loading ??= load();
  return loading;
}

async function load() {
  const links = document.querySelectorAll('link[rel="modulepreload"][data-library]');
  const urls = Object.fromEntries([...links].map((link) => [link.dataset.library, link.href]));
  if (!urls.marked || !urls.dompurify || !urls.highlight) {
    return plainRenderer("this gateway does not serve the Markdown libraries");
  }
  try {
    const [marked, purify, highlight] = await Promise.all(
      [urls.marked, urls.dompurify, urls.highlight].map((url) => import(url)),
    );
    return markdownRenderer(marked, purify.default, highlight.default);
  } catch (error) {
    return plainRenderer(`the Markdown libraries did not load (${error.message})`);
  }
}

// --- plain text ---------------------------------------------------------------------------

function plainRenderer(reason) {
  const show = (container, text) => {
    container.classList.add("plain");
    container.textContent = text;
  };
  return {
    markdown: false,
    reason,
    renderOnce: show,
    view: (container) => ({
      onRender: () => {},
      set(text) {
        show(container, text);
        this.onRender();
      },
      flush() {},
    }),
  };
}

// --- Markdown -----------------------------------------------------------------------------

function markdownRenderer({ Marked }, DOMPurify, hljs) {
  const escape = (text) =>
    text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  const md = new Marked({
    gfm: true,
    breaks: true,
    renderer: {
      // Raw HTML from the model is text to show, never markup.
      html: ({ text, block }) => (block ? `<p>${escape(text)}</p>\n` : escape(text)),
      code({ text, lang }) {
        const language = (lang || "").match(/^\S*/)[0];
        const known = language && hljs.getLanguage(language);
        const body = known
          ? hljs.highlight(text, { language, ignoreIllegals: true }).value
          : escape(text);
        const kind = language ? ` language-${escape(language)}` : "";
        return `<pre><code class="hljs${kind}">${body}\n</code></pre>\n`;
      },
      image: ({ href, text }) => `<a href="${escape(href)}">${escape(text || href)}</a>`,
    },
  });

  DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.hasAttribute("class")) {
      const kept = node.getAttribute("class").split(/\s+/).filter((name) => /^(hljs|language-)[\w-]*$/.test(name));
      if (kept.length) node.setAttribute("class", kept.join(" "));
      else node.removeAttribute("class");
    }
    if (node.tagName === "A") {
      let url = null;
      try {
        url = new URL(node.getAttribute("href") ?? "");
      } catch {
        // relative or malformed: not a link the page follows
      }
      if (url && SAFE_PROTOCOLS.has(url.protocol)) {
        node.setAttribute("target", "_blank");
        node.setAttribute("rel", "noopener noreferrer");
      } else {
        node.removeAttribute("href");
      }
    }
    if (node.tagName === "INPUT") {
      if (node.getAttribute("type") === "checkbox") node.setAttribute("disabled", "");
      else node.remove();
    }
  });
  const sanitize = (html) =>
    DOMPurify.sanitize(html, {
      ALLOWED_TAGS,
      ALLOWED_ATTR,
      ALLOW_DATA_ATTR: false,
      ALLOW_ARIA_ATTR: false,
      RETURN_DOM_FRAGMENT: true,
    });

  // Sanitized HTML as nodes, code blocks given their language label and a copy button.
  const nodes = (html) => {
    const fragment = sanitize(html);
    for (const pre of fragment.querySelectorAll("pre")) {
      const code = pre.querySelector("code");
      if (!code) continue;
      const language = [...code.classList].find((name) => name.startsWith("language-"));
      if (language) code.dataset.language = language.slice("language-".length);
      const wrapper = document.createElement("div");
      wrapper.className = "code";
      pre.replaceWith(wrapper);
      wrapper.append(pre, copyButton(() => code.textContent));
    }
    return [...fragment.childNodes];
  };
  const normalize = (text) => text.replace(/\r\n?/g, "\n");

  return {
    markdown: true,
    reason: null,
    renderOnce(container, text) {
      container.classList.remove("plain");
      container.replaceChildren(...nodes(md.parse(normalize(text))));
    },
    view(container) {
      return new MarkdownView(md, nodes, normalize, container);
    },
  };
}

class MarkdownView {
  constructor(md, nodes, normalize, container) {
    Object.assign(this, { md, nodes, normalize, container });
    this.onRender = () => {}; // called after each render (the page follows the reply down)
    this.text = "";
    this.settled = ""; // the reply's start, rendered for good
    this.open = []; // the nodes of the rest, replaced on every render
    this.frame = 0;
    container.classList.remove("plain");
    container.replaceChildren();
  }

  /** The reply's text so far: rendered on the next animation frame. */
  set(text) {
    this.text = this.normalize(text);
    this.frame ||= requestAnimationFrame(() => this.flush());
  }

  /** Render now (the stream ended, or the page needs the result). */
  flush() {
    cancelAnimationFrame(this.frame);
    this.frame = 0;
    const text = this.text;
    if (!text.startsWith(this.settled)) this.reset();
    const rest = text.slice(this.settled.length);
    const tokens = this.md.lexer(rest);
    for (const node of this.open) node.remove();
    if (Object.keys(tokens.links ?? {}).length) {
      // A link definition reaches back to text before it: from now on the whole reply.
      this.reset();
      this.open = this.nodes(this.md.parse(text));
    } else {
      const settled = settledLength(tokens, rest);
      const done = [];
      let length = 0;
      for (const token of tokens) {
        if (length >= settled) break;
        done.push(token);
        length += token.raw.length;
      }
      if (done.length) {
        this.container.append(...this.nodes(this.md.parser(done)));
        this.settled += rest.slice(0, length);
      }
      this.open = this.nodes(this.md.parser(tokens.slice(done.length)));
    }
    this.container.append(...this.open);
    this.onRender();
  }

  reset() {
    this.settled = "";
    this.open = [];
    this.container.replaceChildren();
  }
}

/**
 * How much of `text` (lexed into top-level `tokens`) later text can no longer change.
 *
 * A block is settled once a blank line follows it and a later line starts at the margin,
 * with two more blocks after it: text can still turn the last block into something else
 * (a paragraph into a heading or a table, a line into a list item) and join it to the one
 * before (another item of the list above), but not reach further back. Link reference
 * definitions do reach back; the view renders a reply with one whole.
 */
export function settledLength(tokens, text) {
  let last = tokens.length - 1;
  for (let open = 0; open < 2; open++) {
    while (last >= 0 && tokens[last].type === "space") last--;
    last--;
  }
  let best = 0;
  let position = 0;
  for (let index = 0; index <= last; index++) {
    position += tokens[index].raw.length;
    if (text.slice(position - tokens[index].raw.length, position) !== tokens[index].raw) break;
    const blankLineBefore = text[position - 1] === "\n" && text[position - 2] === "\n";
    if (blankLineBefore && position < text.length && /\S/.test(text[position])) {
      best = position;
    }
  }
  return best;
}

export function copyButton(text, label = "Copy") {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "copy";
  button.textContent = label;
  button.onclick = async () => {
    try {
      await navigator.clipboard.writeText(text());
      button.textContent = "Copied";
    } catch {
      button.textContent = "Copy failed";
    }
    setTimeout(() => {
      button.textContent = label;
    }, 1500);
  };
  return button;
}
