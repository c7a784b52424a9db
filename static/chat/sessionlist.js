// The sidebar's contents: the session rows (keyed updates, sessions.js `sessionList`), the paging
// button, and the agent picker. Browser only.

import { setAttr, setText } from "./dom.js";
import { selectSession } from "./sessionactions.js";
import { sessionList } from "./sessions.js";
import { state } from "./store.js";
import { updateKeyed } from "./util.js";
import { els, page } from "./view.js";

/** A session row's `status` in words. */
export const STATUS_TEXT = {
  running: "running",
  done: "done",
  failed: "failed",
  killed: "stopped",
  timeout: "timed out",
  new: "new",
};

function formatTime(ms) {
  if (!ms) return "";
  const d = new Date(ms);
  const now = new Date();
  const sameDay = d.toDateString() === now.toDateString();
  return sameDay
    ? d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })
    : d.toLocaleDateString([], { month: "short", day: "numeric" });
}

/** The agent picker for the next new chat, rebuilt when `state.agents` changed; shown with more than one agent. */
export function renderAgents() {
  const agents = state.agents;
  if (!agents || agents === page.renderedAgents) return;
  page.renderedAgents = agents;
  const previous = els.agentPicker.value;
  els.agentPicker.replaceChildren(
    ...agents.list.map((a) => {
      const option = document.createElement("option");
      option.value = a.id;
      option.textContent = a.model && a.model !== a.name ? `${a.name} (${a.model})` : a.name;
      return option;
    }),
  );
  const ids = agents.list.map((a) => a.id);
  els.agentPicker.value = ids.includes(previous) ? previous : ids.includes(agents.defaultId) ? agents.defaultId : ids[0] || "";
  els.agentChoice.hidden = agents.list.length < 2;
}

function sessionElement(item) {
  const li = document.createElement("li");
  li.className = "session-row";
  li.dataset.testid = "session-row";
  li.dataset.key = item.key;
  const btn = document.createElement("button");
  btn.type = "button";
  btn.className = "session-row-btn";
  btn.innerHTML = '<span class="row-label"></span><span class="row-status"></span><span class="row-detail"></span>';
  btn.addEventListener("click", () => selectSession(item.key));
  li.append(btn);
  return li;
}

function updateSessionElement(li, item) {
  const activityText = item.needsApproval ? "waiting for your approval" : item.status === "running" ? "replying…" : "";
  const detail = item.error && (item.status === "failed" || item.status === "timeout") && !item.needsApproval
    ? item.error
    : [activityText, item.queued ? `${item.queued} queued` : "", item.updatedAt ? formatTime(item.updatedAt) : "new session"]
        .filter(Boolean)
        .join(" · ");
  setAttr(li, "data-status", item.status);
  setAttr(li, "data-waiting", item.needsApproval ? "approval" : "");
  setAttr(li, "data-current", String(item.current));
  setAttr(li, "data-queued", String(item.queued));
  setAttr(li, "title", item.error ? `${item.label}: ${item.error}` : item.key);
  const btn = li.firstChild;
  if (item.current) btn.setAttribute("aria-current", "true");
  else btn.removeAttribute("aria-current");
  setText(btn.children[0], item.label);
  setText(btn.children[1], item.needsApproval ? "needs approval" : STATUS_TEXT[item.status] || item.status);
  setText(btn.children[2], detail);
}

/** The session rows, the empty hint, and the button for the next page. */
export function renderSessions() {
  const items = sessionList(state);
  updateKeyed(els.sessionList, page.rowEls, items, (item) => item.key, sessionElement, updateSessionElement);
  els.sessionEmpty.hidden = items.length > 0;
  els.loadMoreSessions.hidden = !(state.listNext && state.listNext.search === state.search);
}
