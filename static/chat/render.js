// Drawing the page from the state (one `render` for a batch of changes, store.js): the connection
// status, the header of the open session and the notice here; the sidebar, the conversation and the
// composer in their own modules.

import { renderAttachments } from "./attachments.js";
import { renderComposer } from "./composer.js";
import { setText } from "./dom.js";
import { renderMessages } from "./messages.js";
import { renderAgents, renderSessions, STATUS_TEXT } from "./sessionlist.js";
import { sessionLabel } from "./sessions.js";
import { state } from "./store.js";
import { needsApproval } from "./tools.js";
import { els } from "./view.js";

/** Draw the whole page from the state; the URL's hash follows the open session. */
export function render() {
  renderConnection();
  renderAgents();
  renderSessions();
  renderHeader();
  renderMessages();
  renderComposer();
  renderAttachments();
  renderNotice();
  const hash = `#${state.currentKey}`;
  if (location.hash !== hash) history.replaceState(null, "", hash);
}

function renderConnection() {
  const { status, retryInMs, error } = state.conn;
  let text = "Connecting…";
  if (status === "online") text = "Connected";
  else if (status === "offline") text = error ? "Disconnected" : retryInMs != null ? "Offline · reconnecting…" : "Offline";
  if (els.conn.dataset.state !== status) els.conn.dataset.state = status;
  setText(els.conn, text);
}

function agentOf(agentId) {
  const list = (state.agents && state.agents.list) || [];
  return list.find((a) => a.id === agentId) || null;
}

function renderHeader() {
  const key = state.currentKey;
  const row = state.rows[key];
  const label = sessionLabel(state, key);
  setText(els.title, label);
  const parts = [key];
  if (row && row.status && !row.hasActiveRun) parts.push(STATUS_TEXT[row.status] || row.status);
  if (row && row.hasActiveRun) parts.push(needsApproval(state, key) ? "waiting for approval" : "running");
  if (row && row.lastRunError && (row.status === "failed" || row.status === "timeout") && !row.hasActiveRun) {
    parts.push(row.lastRunError);
  }
  setText(els.sub, parts.join(" · "));
  els.sub.title = parts.join(" · ");
  const agentId = (row && row.agentId) || key.split(":")[1] || "main";
  const agent = agentOf(agentId);
  const agentText = agent ? `Agent: ${agent.name}${agent.model ? ` · model ${agent.model}` : ""}` : `Agent: ${agentId}`;
  setText(els.agent, agentText);
  const title = `${label} · agentgate`;
  if (document.title !== title) document.title = title;
  els.rename.disabled = !row;
  els.reset.disabled = !row;
}

function renderNotice() {
  const notice = state.notice;
  els.notice.hidden = !notice;
  if (notice) setText(els.noticeText, notice.text);
}
