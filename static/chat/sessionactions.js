// What the user does to sessions: open one, start a new chat, rename, reset and delete the open
// one (asking first). Browser only.

import { ask } from "./dialog.js";
import { call, requestHistory } from "./gateway.js";
import { sessionLabel } from "./sessions.js";
import { closeSidebar } from "./sidebar.js";
import { dispatch, scheduleRender, state } from "./store.js";
import { needsApproval } from "./tools.js";
import { els, page } from "./view.js";

/** Open session `key` (a sidebar row, the URL, a new chat); one that needs approval shows its prompt. */
export function selectSession(key) {
  closeSidebar();
  if (needsApproval(state, key)) page.revealApproval = key;
  if (key === state.currentKey) {
    scheduleRender();
    return;
  }
  page.stickToBottom = true;
  dispatch({ type: "session/select", key });
}

/** New chat: a session of the picked agent (when there is a choice), opened at once. */
export async function newSession() {
  const params = {};
  if (state.agents && state.agents.list.length > 1 && els.agentPicker.value) params.agentId = els.agentPicker.value;
  const payload = await call("sessions.create", params);
  if (!payload) return;
  dispatch({ type: "session/row", row: payload.session });
  selectSession(payload.session.key);
  els.composer.focus();
}

/** Rename the open session (asks for the name). */
export async function renameSession() {
  const key = state.currentKey;
  const row = state.rows[key];
  const label = await ask({
    title: "Rename session",
    input: (row && row.label) || "",
    inputLabel: "Name",
    confirm: "Rename",
  });
  if (label === null) return;
  const payload = await call("sessions.patch", { sessionKey: key, label: label.trim() });
  if (payload) dispatch({ type: "session/row", row: payload.session });
}

/** Reset the open session (asks first): an empty conversation, its runs stopped. */
export async function resetSession() {
  const key = state.currentKey;
  const ok = await ask({
    title: "Reset this session?",
    text: `“${sessionLabel(state, key)}” starts over with an empty conversation. Running and queued messages are stopped.`,
    confirm: "Reset",
    danger: true,
  });
  if (!ok) return;
  const payload = await call("sessions.reset", { sessionKey: key });
  if (!payload) return;
  dispatch({ type: "session/row", row: payload.session });
  requestHistory(key);
}

/** Delete the open session (asks first). */
export async function deleteSession() {
  const key = state.currentKey;
  const ok = await ask({
    title: "Delete this session?",
    text: `“${sessionLabel(state, key)}” and all its messages are deleted. This cannot be undone.`,
    confirm: "Delete",
    danger: true,
  });
  if (!ok) return;
  if (!state.rows[key]) {
    // Never used on the server: nothing to delete there.
    dispatch({ type: "session/deleted", key });
    return;
  }
  const payload = await call("sessions.delete", { sessionKey: key });
  if (payload) dispatch({ type: "session/deleted", key });
}
