// Assistant replies as Markdown (CommonMark + GitHub tables), sanitized, rendered while they stream.
//
// The text is split into top-level blocks (marked's lexer). A block is rendered once and kept
// while its source stays the same; only the last block (the one still growing) is rendered again
// on each delta. Code blocks are highlighted once they are complete: when a later block follows
// them, or when the run ends. Raw HTML in the text is shown as text, never parsed, and every
// rendered block also goes through DOMPurify, so nothing from a model or a user runs.

import { Marked } from "../vendor/marked.esm.js";
import DOMPurify from "../vendor/purify.es.mjs";
import hljs from "../vendor/highlight.min.js";

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const escapeHtml = (text) => String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);

const md = new Marked({
  gfm: true,
  breaks: false,
  renderer: {
    // Raw HTML is shown as typed: the model's (or the user's) markup never becomes elements.
    html({ text }) {
      return escapeHtml(text);
    },
    // Images become links: a reply must not make the browser fetch from anywhere by itself.
    image({ href, text }) {
      return `<a href="${escapeHtml(href || "")}">${escapeHtml(text || href || "image")}</a>`;
    },
  },
});

const PURIFY = {
  ALLOWED_URI_REGEXP: /^(?:https?|mailto):|^[^a-z]|^[a-z+.-]+(?:[^a-z+.\-:]|$)/i,
  FORBID_TAGS: ["style", "img", "svg", "math", "form", "input", "button", "textarea", "select", "iframe", "video", "audio"],
  FORBID_ATTR: ["style", "id", "name"],
  RETURN_DOM_FRAGMENT: true,
};

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    if (!node.getAttribute("href")) node.removeAttribute("href");
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

/** Sanitized DOM for one block token (or, when `tokens` is a list, for several). */
function blockFragment(tokens, links) {
  const list = Array.isArray(tokens) ? tokens : [tokens];
  const html = md.parser(Object.assign([...list], { links: links || {} }));
  const frag = DOMPurify.sanitize(html, PURIFY);
  decorate(frag);
  return frag;
}

/** Code blocks get a header with their language and a copy button; wide tables scroll. */
function decorate(root) {
  for (const pre of root.querySelectorAll("pre")) {
    const code = pre.querySelector("code");
    const lang = code ? ((code.className.match(/language-([\w+#.-]+)/) || [])[1] || "") : "";
    const box = document.createElement("div");
    box.className = "code-block";
    const head = document.createElement("div");
    head.className = "code-head";
    const label = document.createElement("span");
    label.className = "code-lang";
    label.textContent = lang || "text";
    const copy = document.createElement("button");
    copy.type = "button";
    copy.className = "btn btn-quiet btn-small code-copy";
    copy.dataset.testid = "copy-code";
    copy.textContent = "Copy code";
    head.append(label, copy);
    pre.replaceWith(box);
    pre.tabIndex = 0; // it may scroll sideways: keyboard users must reach it
    box.append(head, pre);
  }
  for (const table of root.querySelectorAll("table")) {
    const wrap = document.createElement("div");
    wrap.className = "table-wrap";
    wrap.tabIndex = 0;
    table.replaceWith(wrap);
    wrap.append(table);
  }
}

function highlight(blockEl) {
  for (const code of blockEl.querySelectorAll("pre code")) {
    if (code.dataset.highlighted) continue;
    const lang = (code.className.match(/language-([\w+#.-]+)/) || [])[1];
    const text = code.textContent;
    let result = null;
    try {
      if (lang && hljs.getLanguage(lang)) result = hljs.highlight(text, { language: lang, ignoreIllegals: true });
      else if (!lang && text.length <= 20000) result = hljs.highlightAuto(text);
    } catch {
      result = null;
    }
    code.dataset.highlighted = "yes";
    if (!result) continue;
    // highlight.js escapes the text itself; the result still goes through DOMPurify.
    code.replaceChildren(DOMPurify.sanitize(result.value, { ALLOWED_TAGS: ["span"], ALLOWED_ATTR: ["class"], RETURN_DOM_FRAGMENT: true }));
    code.classList.add("hljs");
  }
}

const views = new WeakMap(); // container -> {text, final, blocks: [{raw, el, done}]}

/**
 * Render `text` as Markdown into `container`, reusing what an earlier call rendered.
 * `final`: the text is complete (the run ended), so the last block is complete too.
 */
export function renderMarkdown(container, text, { final = false } = {}) {
  let view = views.get(container);
  if (!view) {
    view = { text: null, final: false, blocks: [] };
    views.set(container, view);
    container.replaceChildren();
  }
  if (view.text === text && view.final === final) return;
  view.text = text;
  view.final = final;
  const tokens = md.lexer(text || "");
  const links = tokens.links || {};
  const n = tokens.length;
  let i = 0;
  // Keep the leading blocks whose source did not change (and that were complete, or still are the tail).
  while (i < n && i < view.blocks.length && view.blocks[i].raw === tokens[i].raw) {
    const done = final || i < n - 1;
    if (done && !view.blocks[i].done) break; // the tail just became complete: render it once more, highlighted
    i += 1;
  }
  for (const block of view.blocks.slice(i)) block.el.remove();
  view.blocks.length = i;
  for (; i < n; i += 1) {
    const token = tokens[i];
    const done = final || i < n - 1;
    const el = document.createElement("div");
    el.className = "md-block";
    if (token.type !== "space") el.append(blockFragment(token, links));
    if (done) highlight(el);
    container.append(el);
    view.blocks.push({ raw: token.raw, el, done });
  }
}

/** Forget what was rendered into `container` (it is reused for other text). */
export function resetMarkdown(container) {
  views.delete(container);
}
