// Branches of the open conversation (docs/branches.md): Regenerate a reply and Edit a user message as
// sibling branches (`chat.regenerate`), and "‹ 2/3 ›" between a message's siblings
// (`sessions.branches.switch`). Nothing is deleted: the other branches stay, one click away.
// `branchHandlers` is pure (the reducer's); the rest is browser only.

import { TERMINAL_PHASES, runKey } from "./model.js";
import { newRun, putRun } from "./runs.js";

/** The reducer's action: the active branch of `key` changed (`runId`: the run that started it, whose end
 * reloads history again); the next history replaces what is shown. */
export const branchHandlers = {
  "branch/changed": (s, { key, runId }) => {
    // The runs this page saw end belong to whichever branch they were on: history says what is shown now.
    const runs = {};
    for (const [id, run] of Object.entries(s.runs)) if (run.key !== key || !TERMINAL_PHASES.has(run.phase)) runs[id] = run;
    s.runs = runs;
    const conv = s.convs[key];
    if (conv) s.convs = { ...s.convs, [key]: { ...conv, replaceAll: true } };
    if (runId) {
      const run = s.runs[runKey(key, runId)] || newRun(s, key, runId, { ackTick: s.tick, sessionId: conv ? conv.sessionId : null });
      if (!TERMINAL_PHASES.has(run.phase)) putRun(s, { ...run, reloadOnEnd: true }); // (else: history is asked anyway)
    }
  },
};

/** A new idempotency key for a regeneration. */
function newRunId() {
  const bytes = new Uint8Array(8);
  crypto.getRandomValues(bytes);
  return `web-${Date.now().toString(36)}-${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("")}`;
}

/** The entry id of conversation item `item` (its history message id), read from history when this page
 * only saw it live. For a reply that stored no message (stopped before any text), its user message. */
async function entryOf(client, key, item) {
  if (item.entryId) return String(item.entryId);
  const res = await client.request("chat.history", { sessionKey: key, limit: 50 });
  if (!res.ok) throw res.error;
  const messages = res.payload.messages || [];
  const roles = item.role === "assistant" ? ["assistant", "user"] : ["user"];
  for (const role of roles) {
    const found = messages.filter((m) => m.role === role && m.runId === item.runId && !m.command).pop();
    if (found) return String(found.id);
  }
  return null;
}

/** Browser side: what the buttons do, given the page's modules (kept out of the pure part's imports;
 * `current()` is the store's state now). */
export function branchActions({ client, call, dispatch, requestHistory, scheduleRender, current, conversation, page, reportFailure }) {
  const changed = (key, runId = null) => {
    dispatch({ type: "branch/changed", key, runId });
    requestHistory(key);
  };

  async function regenerate(item, message) {
    const key = current().currentKey;
    const entryId = await entryOf(client, key, item);
    if (!entryId) {
      dispatch({ type: "notice", text: "This message cannot be regenerated: it was never stored." });
      return;
    }
    page.stickToBottom = true;
    const params = { sessionKey: key, entryId, idempotencyKey: newRunId() };
    if (message != null) params.message = message;
    const ack = await call("chat.regenerate", params, message != null ? "Edit" : "Regenerate");
    if (ack) changed(key, ack.runId);
  }

  async function switchTo(item, step) {
    const key = current().currentKey;
    const sib = item.siblings;
    const leaf = sib && sib.leaves[sib.index - 1 + step];
    if (!leaf) return;
    const answer = await call("sessions.branches.switch", { sessionKey: key, leafEntryId: leaf }, "Switch branch");
    if (answer) changed(key);
  }

  /** Handle a button of a message row; false for an action that is not ours. */
  return function act(action, itemId, row) {
    const state = current();
    const item = conversation(state, state.currentKey).find((i) => i.id === itemId);
    if (!item) return false;
    const run = (fn) =>
      fn().catch((error) => reportFailure(action === "regenerate" ? "Regenerate" : "Branch", error));
    switch (action) {
      case "regenerate":
        run(() => regenerate(item));
        return true;
      case "edit":
        page.editing = { itemId, text: item.text };
        scheduleRender();
        queueMicrotask(() => {
          const box = row.querySelector('[data-testid="edit-box"]');
          if (box) {
            box.value = item.text;
            box.focus();
          }
        });
        return true;
      case "edit-cancel":
        page.editing = null;
        scheduleRender();
        return true;
      case "edit-send": {
        const box = row.querySelector('[data-testid="edit-box"]');
        const text = box ? box.value : "";
        if (!text.trim()) return true;
        page.editing = null;
        scheduleRender();
        run(() => regenerate(item, text));
        return true;
      }
      case "branch-prev":
        run(() => switchTo(item, -1));
        return true;
      case "branch-next":
        run(() => switchTo(item, 1));
        return true;
      default:
        return false;
    }
  };
}
