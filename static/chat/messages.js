// The conversation's DOM: one row per item of conversation.js `conversation` (keyed updates), each a
// message bubble with its status line, run details and actions, or a tool card (toolcard.js); the
// scroll position, and the approval countdowns. Browser only.

import { chip } from "./attachments.js";
import { conversation, editTarget, retryTarget } from "./conversation.js";
import { setAttr, setText } from "./dom.js";
import { renderMarkdown } from "./markdown.js";
import { cancelQueued } from "./messageactions.js";
import { TERMINAL_PHASES } from "./model.js";
import { activity } from "./runs.js";
import { state } from "./store.js";
import { formatDetails } from "./texts.js";
import { createToolCard, updateCountdown, updateToolCard } from "./toolcard.js";
import { updateKeyed } from "./util.js";
import { els, page } from "./view.js";

/** The status line of a message, when it has one: `{text, cancel?}` (`cancel`: a queued message's Cancel). */
function metaFor(item) {
  switch (item.state) {
    case "sending":
      return { text: state.conn.status === "online" ? "Sending…" : "Waiting for the connection…" };
    case "queued":
      return { text: item.position ? `Queued · #${item.position}` : "Queued", cancel: true };
    case "steering":
      // Sent into the working reply (steering.js); Cancel withdraws it until the agent reads it.
      return { text: "Sent into the reply · the agent reads it at its next step", cancel: true };
    case "error": {
      if (item.unconfirmed) return { text: item.error };
      const kind = item.errorKind && item.errorKind !== "error" ? ` (${item.errorKind})` : "";
      return { text: item.role === "user" ? `Not sent${kind}: ${item.error}` : `Error${kind}: ${item.error}` };
    }
    case "aborted":
      return { text: item.meta || "Stopped" };
    default:
      return null;
  }
}

/** A new, empty row for `item`: a message bubble with its status line and actions, or a tool card. */
function messageElement(item) {
  if (item.role === "tool") return createToolCard(document); // a tool call (toolcard.js)
  // A row holds the message bubble and, under it, its run details and actions. The bubble
  // (`data-testid="message"`) holds only the message and its status line.
  const row = document.createElement("div");
  row.className = "msg-row";
  const el = document.createElement("article");
  el.className = "msg";
  el.dataset.testid = "message";
  const body = document.createElement("div");
  body.className = "msg-text";
  if (item.role === "assistant") {
    body.classList.add("markdown");
    body.dataset.testid = "markdown";
  }
  const meta = document.createElement("div");
  meta.className = "msg-meta";
  meta.hidden = true;
  el.append(body, meta);
  const foot = document.createElement("div");
  foot.className = "msg-foot";
  if (item.role === "assistant") {
    const runMeta = document.createElement("span");
    runMeta.className = "run-meta";
    runMeta.dataset.testid = "run-meta";
    runMeta.hidden = true;
    foot.append(runMeta);
  }
  foot.append(branchNav());
  const actions =
    item.role === "user" ? [["copy", "Copy"], ["edit", "Edit"], ["retry", "Retry"]] : [["copy", "Copy"], ["regenerate", "Regenerate"], ["retry", "Retry"]];
  for (const [action, label] of actions) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "btn btn-quiet btn-small msg-action";
    button.dataset.testid = action;
    button.dataset.action = action;
    button.textContent = label;
    button.hidden = action !== "copy";
    foot.append(button);
  }
  if (item.role === "user") row.append(el, editor(), foot);
  else row.append(el, foot);
  return row;
}

/** A small button of a message row, acting by `data-action`. */
function smallButton(action, label, testid = action) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "btn btn-quiet btn-small msg-action";
  button.dataset.testid = testid;
  button.dataset.action = action;
  button.textContent = label;
  return button;
}

/** "‹ 2/3 ›" between a message's siblings (hidden when it has none). */
function branchNav() {
  const nav = document.createElement("span");
  nav.className = "branch-nav";
  nav.dataset.testid = "branch-nav";
  nav.hidden = true;
  const position = document.createElement("span");
  position.dataset.testid = "branch-position";
  const prev = smallButton("branch-prev", "‹");
  prev.setAttribute("aria-label", "Previous branch");
  const next = smallButton("branch-next", "›");
  next.setAttribute("aria-label", "Next branch");
  nav.append(prev, position, next);
  return nav;
}

/** The editor of a user message: the edited text is sent as a sibling branch (chat.regenerate). */
function editor() {
  const form = document.createElement("div");
  form.className = "msg-editor";
  form.dataset.testid = "editor";
  form.hidden = true;
  const box = document.createElement("textarea");
  box.dataset.testid = "edit-box";
  box.setAttribute("aria-label", "Edit your message");
  form.append(box, smallButton("edit-send", "Send"), smallButton("edit-cancel", "Cancel"));
  return form;
}

/** Bring the status line `metaEl` of a message of session `key` up to date (rebuilt only when it changed). */
function updateMeta(metaEl, item, key) {
  const meta = metaFor(item);
  const signature = meta ? `${meta.text}|${meta.cancel ? 1 : 0}` : "";
  if (metaEl.dataset.sig === signature) return;
  metaEl.dataset.sig = signature;
  metaEl.replaceChildren();
  metaEl.hidden = !meta;
  if (!meta) return;
  const span = document.createElement("span");
  span.textContent = meta.text;
  metaEl.append(span);
  if (meta.cancel && item.runId) {
    const cancel = document.createElement("button");
    cancel.type = "button";
    cancel.className = "btn btn-quiet btn-small";
    cancel.dataset.testid = "cancel-queued";
    cancel.textContent = "Cancel";
    const runId = item.runId;
    cancel.addEventListener("click", () => cancelQueued(key, runId));
    metaEl.append(cancel);
  }
}

/** The row under a message: a finished reply's details, its siblings, and Copy, Edit, Regenerate and Retry
 * where they apply (Edit and Regenerate make a sibling branch; Retry sends a refused message again). */
function updateFoot(foot, item, { retry, edit, idle }) {
  const ended = TERMINAL_PHASES.has(item.state);
  const details = item.role === "assistant" && ended ? formatDetails(item.details) : "";
  const part = (testid) => foot.querySelector(`[data-testid="${testid}"]`);
  const runMeta = part("run-meta");
  if (runMeta) {
    setText(runMeta, details);
    runMeta.hidden = !details;
  }
  const [copyBtn, editBtn, retryBtn] = [part("copy"), part("edit"), part("retry")];
  copyBtn.hidden = !item.text || item.state === "streaming";
  setAttr(copyBtn, "aria-label", item.role === "user" ? "Copy your message" : "Copy the reply");
  if (editBtn) {
    editBtn.hidden = !(edit && edit.itemId === item.id && item.state === "final") || Boolean(page.editing);
    editBtn.disabled = !idle;
    setAttr(editBtn, "aria-label", "Edit your last message");
  }
  const regenerateBtn = part("regenerate");
  if (regenerateBtn) {
    regenerateBtn.hidden = !(retry && retry.itemId === item.id);
    regenerateBtn.disabled = !(retry && retry.enabled);
    setAttr(regenerateBtn, "aria-label", "Regenerate the reply");
  }
  retryBtn.hidden = !(retry && retry.itemId === item.id && item.role === "user");
  retryBtn.disabled = !(retry && retry.enabled);
  setAttr(retryBtn, "aria-label", "Run the last message again");
  const nav = part("branch-nav");
  const sib = item.siblings;
  nav.hidden = !sib;
  if (sib) {
    setText(part("branch-position"), `${sib.index}/${sib.count}`);
    part("branch-prev").disabled = sib.index <= 1 || !idle;
    part("branch-next").disabled = sib.index >= sib.count || !idle;
  }
  foot.hidden = [...foot.children].every((child) => child.hidden);
}

/** A user message's files, under its text: thumbnails of images, chips with name and size. */
function updateAttachments(el, item) {
  const files = item.attachments || [];
  const signature = files.map((a) => a.fileId).join(",");
  let box = el.querySelector(":scope > .msg-attachments");
  if ((box ? box.dataset.sig : "") === signature) return;
  if (!box) {
    box = document.createElement("div");
    box.className = "attachments msg-attachments";
    box.dataset.testid = "message-attachments";
    el.append(box); // after the text and the status line, which keep their places (children 0 and 1)
  }
  box.dataset.sig = signature;
  box.replaceChildren(
    ...files.map((a) => chip(document, { name: a.fileName || a.fileId, size: a.size, mime: a.mimeType, src: `/api/files/${encodeURIComponent(a.fileId)}` })),
  );
  box.hidden = files.length === 0;
}

/** Bring `row` up to date with conversation item `item` of session `key`. */
function updateMessageRow(row, item, { key, retry, edit, idle, now }) {
  row.dataset.itemId = item.id;
  if (item.role === "tool") {
    updateToolCard(row, item.view, { now });
    return;
  }
  const el = row.firstChild;
  setAttr(row, "data-role", item.role);
  setAttr(el, "data-role", item.role);
  setAttr(el, "data-state", item.state);
  setAttr(el, "data-run-id", item.runId || "");
  setAttr(el, "data-position", item.position ? String(item.position) : "");
  updateAttachments(el, item);
  const body = el.children[0];
  if (body.dataset.testid === "markdown") renderMarkdown(body, item.text, { final: item.state !== "streaming" });
  else setText(body, item.text);
  updateMeta(el.children[1], item, key);
  if (item.role === "user") row.children[1].hidden = !(page.editing && page.editing.itemId === item.id);
  updateFoot(row.lastChild, item, { retry, edit, idle });
}

/** A session opened from its "needs approval" row: its pending prompt is scrolled into view once loaded. */
function revealApproval(key, conv) {
  if (page.revealApproval === key && conv && conv.loaded) {
    // Show the prompt (no focus move: a stray Enter must not decide).
    const prompt = els.messageList.querySelector('[data-testid="tool-approval"][data-state="pending"]');
    if (prompt) prompt.scrollIntoView({ block: "center" });
    page.revealApproval = null;
  } else if (page.revealApproval && page.revealApproval !== key) {
    page.revealApproval = null;
  }
}

/** Draw the open session's conversation, keeping the reader's place (or the end, when following it). */
export function renderMessages() {
  const box = els.messages;
  const key = state.currentKey;
  if (page.renderedKey !== key) {
    for (const el of page.msgEls.values()) el.remove();
    page.msgEls.clear();
    page.renderedKey = key;
    page.stickToBottom = true;
  }
  const items = conversation(state, key);
  const act = activity(state, key);
  const idle = !act.active && !act.pending && act.queued === 0;
  const context = { key, retry: retryTarget(state, key, items), edit: editTarget(state, key, items), idle, now: Date.now() };
  const conv = state.convs[key];
  const nearBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
  const heightBefore = box.scrollHeight;
  const firstBefore = els.messageList.firstChild;
  updateKeyed(els.messageList, page.msgEls, items, (item) => item.id, messageElement, (row, item) => updateMessageRow(row, item, context));
  els.loadOlder.hidden = !(conv && conv.hasMore);
  els.loadOlder.disabled = Boolean(conv && conv.loadingOlder);
  els.emptyHint.hidden = items.length > 0 || !(conv && conv.loaded);
  const prepended = firstBefore && els.messageList.firstChild !== firstBefore && firstBefore.isConnected;
  if (prepended && !page.stickToBottom) {
    box.scrollTop += box.scrollHeight - heightBefore; // keep the reader's place after older messages load
  } else if (nearBottom || page.stickToBottom) {
    box.scrollTop = box.scrollHeight;
  }
  if (conv && conv.loaded && items.length) page.stickToBottom = false;
  revealApproval(key, conv);
  syncCountdowns();
}

const COUNTDOWNS = '[data-testid="approval-countdown"][data-deadline]';

/** Tick the approval countdowns once a second while one is shown (the reducer has no clock). */
function syncCountdowns() {
  const any = els.messageList.querySelector(COUNTDOWNS) !== null;
  if (any && !page.countdownTimer) {
    page.countdownTimer = setInterval(() => {
      const now = Date.now();
      for (const node of els.messageList.querySelectorAll(COUNTDOWNS)) updateCountdown(node, now);
      syncCountdowns();
    }, 1000);
  } else if (!any && page.countdownTimer) {
    clearInterval(page.countdownTimer);
    page.countdownTimer = null;
  }
}
