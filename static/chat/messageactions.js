// What the user does to messages: send, retry, copy, stop, cancel a queued one, and decide an
// approval. Browser only.

import { attached, attachmentsBlock, takeAttachments } from "./attachments.js";
import { retryTarget } from "./conversation.js";
import { reportFailure } from "./failures.js";
import { call, client } from "./gateway.js";
import { activity } from "./runs.js";
import { dispatch, scheduleRender, state } from "./store.js";
import { els, page } from "./view.js";

/** A new run id, the idempotency key of a chat.send. */
function newRunId() {
  const bytes = new Uint8Array(8);
  crypto.getRandomValues(bytes);
  const hex = Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  return `web-${Date.now().toString(36)}-${hex}`;
}

/** Send the composer's text as a message of the open session (`queue`: after the working run, never into it). */
export function sendComposer({ queue = false } = {}) {
  const text = els.composer.value;
  if (attachmentsBlock()) return; // an upload still going, or one that failed: the message stays
  if (!text.trim() && attached.length === 0) return;
  const max = state.policy.maxMessageChars;
  if (text.length > max) {
    dispatch({ type: "notice", text: `Messages are limited to ${max} characters.` });
    return;
  }
  page.stickToBottom = true;
  const attachments = takeAttachments();
  dispatch({ type: "send/request", key: state.currentKey, runId: newRunId(), text, attachments, queue });
  els.composer.focus();
}

/** Run the last reply again: the same user text through chat.send, with a new idempotency key. */
export function retryLast() {
  const key = state.currentKey;
  const target = retryTarget(state, key);
  if (!target || !target.enabled) return;
  // A refused send put its text back in the composer: the retry takes it from there.
  const keepDraft = els.composer.value !== target.text;
  page.stickToBottom = true;
  dispatch({ type: "send/request", key, runId: newRunId(), text: target.text, keepDraft });
}

/** Copy `text` to the clipboard; `button` says whether it worked for a moment. */
export async function copyText(text, button) {
  let ok = false;
  try {
    await navigator.clipboard.writeText(text);
    ok = true;
  } catch {
    // No async clipboard (not a secure context): the selection way.
    const area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "visually-hidden";
    document.body.append(area);
    area.select();
    try {
      ok = document.execCommand("copy");
    } catch {
      ok = false;
    }
    area.remove();
  }
  if (!button) return;
  const label = button.dataset.label || button.textContent;
  button.dataset.label = label;
  button.textContent = ok ? "Copied" : "Copy failed";
  clearTimeout(button._timer);
  button._timer = setTimeout(() => {
    button.textContent = label;
  }, 1500);
}

/** Stop the open session's active runs (the Stop button): one chat.abort per run, or one for the session. */
export async function stopRuns() {
  const key = state.currentKey;
  const ids = activity(state, key).activeRunIds;
  page.stopping = true;
  scheduleRender();
  try {
    const calls = ids.length
      ? ids.map((runId) => client.request("chat.abort", { sessionKey: key, runId }))
      : [client.request("chat.abort", { sessionKey: key })];
    const results = await Promise.all(calls);
    dispatch({ type: "stop/answered", key, results }); // a refusal: a notice; nothing stopped: a resync
  } catch (error) {
    reportFailure("Stop", error);
  } finally {
    page.stopping = false;
    scheduleRender();
  }
}

/** Take queued run `runId` of `key` out of the queue (its Cancel button). */
export async function cancelQueued(key, runId) {
  await call("chat.abort", { sessionKey: key, runId }, "Cancel");
}

/** Send a decision (`allow-once` or `deny`) for approval `id`; the card shows the decision the gateway recorded. */
export async function decideApproval(id, decision) {
  const approval = state.approvals[id];
  if (!approval || approval.status !== "pending" || approval.sending) return;
  dispatch({ type: "approval/sending", id, decision });
  let response;
  try {
    response = await client.request("plugin.approval.resolve", { id, decision });
  } catch (error) {
    dispatch({ type: "approval/answered", id, decision, error });
    return;
  }
  dispatch({ type: "approval/answered", id, decision, response });
}
