// The chat page's entry module (templates/chat/index.html loads it): starts the store with the
// reducer's state (state.js), wires the page's elements to the user actions, and connects.
//
// All protocol decisions live in the pure state modules (state.js and the modules of its table);
// the browser modules carry out their effects (effects.js, gateway.js) and draw (render.js).

import { wireAttachments } from "./attachments.js";
import { branchActions } from "./branches.js";
import { autosize, setComposer } from "./composer.js";
import { conversation } from "./conversation.js";
import { runEffect } from "./effects.js";
import { guarded, reportFailure } from "./failures.js";
import { call, client, requestHistory, requestMoreSessions, requestOlder } from "./gateway.js";
import { copyText, decideApproval, retryLast, sendComposer, stopRuns } from "./messageactions.js";
import { canonicalKey } from "./policy.js";
import { render } from "./render.js";
import { deleteSession, newSession, renameSession, resetSession, selectSession } from "./sessionactions.js";
import { closeSidebar, openSidebar, sidebarIsOpen } from "./sidebar.js";
import { initialState } from "./state.js";
import { localStore, persist } from "./storage.js";
import { dispatch, scheduleRender, startStore, state } from "./store.js";
import { els, page, root } from "./view.js";

const SEARCH_DEBOUNCE_MS = 250;

/** The session key in the URL hash; null when there is none or it is malformed (e.g. `#100%`). */
function keyFromHash(policy) {
  let raw;
  try {
    raw = decodeURIComponent(location.hash.replace(/^#/, ""));
  } catch {
    return null; // not valid percent-encoding: the default session opens instead
  }
  return raw ? canonicalKey(raw, "main", policy) : null;
}

// Drafts and unsent messages survive a reload, per user.
const stored = localStore(`agentgate:${root.dataset.user || ""}:`);

startStore(initialState({ currentKey: keyFromHash(), drafts: stored.load("drafts", {}) }), {
  runEffect,
  persist: (s) => persist(stored, s),
  render,
});

// --- wiring ---------------------------------------------------------------------------------------------------

els.form.addEventListener("submit", (ev) => {
  ev.preventDefault();
  sendComposer();
});
els.composer.addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey && !ev.altKey && !ev.ctrlKey && !ev.metaKey && !ev.isComposing) {
    ev.preventDefault();
    sendComposer();
  } else if (ev.key === "Enter" && ev.altKey && !ev.shiftKey && !ev.ctrlKey && !ev.metaKey && !ev.isComposing) {
    ev.preventDefault();
    sendComposer({ queue: true }); // after the current reply, not into it
  }
});
els.composer.addEventListener("input", () => {
  autosize();
  dispatch({ type: "draft/set", key: state.currentKey, text: els.composer.value });
});
const branchAction = branchActions({ client, call, dispatch, requestHistory, scheduleRender, current: () => state, conversation, page, reportFailure });
els.stop.addEventListener("click", stopRuns);
wireAttachments();
els.messageList.addEventListener("click", (ev) => {
  const button = ev.target.closest("button");
  if (!button || !els.messageList.contains(button)) return;
  if (button.dataset.action === "approve" || button.dataset.action === "deny") {
    const id = button.dataset.approvalId;
    if (id) guarded("Approval", decideApproval)(id, button.dataset.action === "approve" ? "allow-once" : "deny");
    return;
  }
  if (button.classList.contains("code-copy")) {
    const code = button.closest(".code-block").querySelector("pre code");
    copyText(code ? code.textContent.replace(/\n$/, "") : "", button);
    return;
  }
  const row = button.closest(".msg-row");
  const action = button.dataset.action;
  if (!row || !action) return;
  if (branchAction(action, row.dataset.itemId, row)) return; // Regenerate, Edit, "‹ 2/3 ›"
  if (action === "copy") {
    const item = conversation(state, state.currentKey).find((i) => i.id === row.dataset.itemId);
    if (item) copyText(item.text, button);
  } else if (action === "retry") {
    retryLast();
  }
});
els.search.addEventListener("input", () => {
  clearTimeout(page.searchTimer);
  page.searchTimer = setTimeout(() => {
    if (els.search.value.trim() !== state.search) dispatch({ type: "search/set", text: els.search.value });
  }, SEARCH_DEBOUNCE_MS);
});
// A search typed (or restored by the browser) before this module ran still searches.
if (els.search.value.trim()) dispatch({ type: "search/set", text: els.search.value });
els.loadMoreSessions.addEventListener("click", requestMoreSessions);
els.sessionList.addEventListener(
  "scroll",
  () => {
    const list = els.sessionList;
    if (list.scrollHeight - list.scrollTop - list.clientHeight < 120) requestMoreSessions();
  },
  { passive: true },
);
els.newSession.addEventListener("click", guarded("New chat", newSession));
els.rename.addEventListener("click", guarded("Rename", renameSession));
els.reset.addEventListener("click", guarded("Reset", resetSession));
els.remove.addEventListener("click", guarded("Delete", deleteSession));
els.noticeClose.addEventListener("click", () => dispatch({ type: "notice", text: null }));
els.loadOlder.addEventListener("click", () => requestOlder(state.currentKey));
els.messages.addEventListener(
  "scroll",
  () => {
    if (els.messages.scrollTop < 80) requestOlder(state.currentKey);
  },
  { passive: true },
);
els.sidebarToggle.addEventListener("click", () => {
  if (sidebarIsOpen()) closeSidebar();
  else openSidebar();
});
els.backdrop.addEventListener("click", closeSidebar);
document.addEventListener("keydown", (ev) => {
  if (ev.key === "Escape" && sidebarIsOpen()) closeSidebar();
});
window.addEventListener("hashchange", () => {
  // A hash that names no valid session (or is malformed) opens the default one.
  const key = keyFromHash(state.policy) || state.mainKey;
  if (key !== state.currentKey) selectSession(key);
  else scheduleRender(); // puts the open session's key back in the URL
});
window.addEventListener("online", () => client.reconnectNow());

els.dialog.querySelector("form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  els.dialog.close(ev.submitter ? ev.submitter.value : "ok");
});
els.dialogInput.addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.isComposing) {
    ev.preventDefault();
    els.dialog.close("ok");
  }
});

// For tests and debugging: a read-only look at the state.
Object.defineProperty(window, "agentgate", { value: { get state() { return state; } } });

// Messages that were waiting for the connection when the page was closed go out once, with
// the same idempotency key (the server answers a resend of one that did go out with its ack).
for (const item of stored.load("outbox", [])) {
  if (item && typeof item.key === "string" && typeof item.runId === "string" && typeof item.text === "string") {
    const attachments = Array.isArray(item.attachments) ? item.attachments.filter((a) => a && typeof a.fileId === "string") : [];
    dispatch({ type: "send/request", key: item.key, runId: item.runId, text: item.text, attachments, queueMode: item.queueMode || null, restored: true });
  }
}
setComposer(state.drafts[state.currentKey] || "");
render();
client.start();
els.composer.focus();
