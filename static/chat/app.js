// The chat page: wires the WebSocket client to the pure state module and renders state to the DOM.
// All protocol decisions live in state.js; this file only carries out its effects and draws.

import { GatewayClient } from "./client.js";
import { renderMarkdown } from "./markdown.js";
import { createToolCard, updateCountdown, updateToolCard } from "./toolcard.js";
import { coalesce, updateKeyed } from "./util.js";
import {
  activity,
  canonicalKey,
  conversation,
  editTarget,
  failureText,
  formatDetails,
  initialState,
  needsApproval,
  outbox,
  reduce,
  retryTarget,
  sessionList,
  shortName,
  storedDrafts,
  storedOutbox,
} from "./state.js";

const PAGE_SIZE = 50;
const LIST_LIMIT = 200;
const SEARCH_DEBOUNCE_MS = 250;

const root = document.getElementById("app");
const $ = (selector) => root.querySelector(selector);
const els = {
  conn: $('[data-testid="connection-status"]'),
  sidebarToggle: $('[data-testid="toggle-sidebar"]'),
  backdrop: $('[data-testid="sidebar-backdrop"]'),
  sessionList: $("#session-list"),
  newSession: $('[data-testid="new-session"]'),
  agentChoice: $(".agent-choice"),
  agentPicker: $('[data-testid="agent-picker"]'),
  search: $('[data-testid="session-search"]'),
  sessionEmpty: $("#session-empty"),
  loadMoreSessions: $('[data-testid="load-more-sessions"]'),
  title: $("#chat-title"),
  sub: $("#chat-sub"),
  agent: $("#chat-agent"),
  rename: $('[data-testid="rename-session"]'),
  reset: $('[data-testid="reset-session"]'),
  remove: $('[data-testid="delete-session"]'),
  notice: $("#notice"),
  noticeText: $("#notice .notice-text"),
  noticeClose: $("#notice .notice-close"),
  messages: $("#messages"),
  messageList: $("#message-list"),
  loadOlder: $('[data-testid="load-older"]'),
  emptyHint: $("#empty-hint"),
  form: $("#composer-form"),
  composer: $('[data-testid="composer"]'),
  send: $('[data-testid="send"]'),
  stop: $('[data-testid="stop"]'),
  status: $("#composer-status"),
  dialog: $("#dialog"),
  dialogTitle: $("#dialog-title"),
  dialogText: $("#dialog-text"),
  dialogLabel: $("#dialog-label"),
  dialogInput: $("#dialog-input"),
  dialogConfirm: $('[data-testid="dialog-confirm"]'),
};

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

// --- storage: drafts and unsent messages survive a reload ----------------------------------------------

const STORE_PREFIX = `agentgate:${root.dataset.user || ""}:`;

function loadStored(name, fallback) {
  try {
    const raw = localStorage.getItem(STORE_PREFIX + name);
    return raw ? JSON.parse(raw) : fallback;
  } catch {
    return fallback; // storage disabled or damaged: start empty
  }
}

const written = { drafts: null, outbox: null }; // the text last written, per name: unchanged ones are not written again

function saveStored(name, value) {
  const text = JSON.stringify(value);
  if (written[name] === text) return;
  written[name] = text;
  try {
    if (text === "{}" || text === "[]") localStorage.removeItem(STORE_PREFIX + name);
    else localStorage.setItem(STORE_PREFIX + name, text);
  } catch {
    // full or disabled: the page works, only without surviving a reload
  }
}

// The reducer's state (state.js): changed only by `dispatch`, read everywhere.
let state = initialState({ currentKey: keyFromHash(), drafts: loadStored("drafts", {}) });

// Everything else this page keeps between events: view state that is not the reducer's.
const page = {
  stickToBottom: true, // the next render scrolls the conversation to its end (a send, another session, first load)
  stopping: false, // the Stop button's chat.abort requests are in flight: it is disabled meanwhile
  renderPending: false, // a render is scheduled (one microtask for a batch of dispatches)
  searchTimer: null, // the sidebar search's debounce timer
  rowEls: new Map(), // session key -> its sidebar row (<li>)
  msgEls: new Map(), // conversation item id -> its message row, for the session `renderedKey`
  renderedKey: null, // the session whose messages are in the DOM
  renderedAgents: null, // the `state.agents` the agent picker was last built from
  countdownTimer: null, // ticks the approval countdowns once a second while one is shown
  revealApproval: null, // a session opened from its "needs approval" row: scroll its pending approval into view
};

// --- store ---------------------------------------------------------------------------------------

// Every state change goes through here: the reducer, its effects, storage, then a render.
function dispatch(action) {
  state = reduce(state, action);
  const effects = state.effects;
  for (const eff of effects) runEffect(eff);
  persist(state);
  scheduleRender();
}

/** What survives a reload: drafts and unsent messages (only written when they changed). */
function persist(s) {
  saveStored("drafts", storedDrafts(s));
  saveStored("outbox", storedOutbox(s)); // an item leaves once its ack arrived
}

function runEffect(eff) {
  switch (eff.type) {
    case "history":
      requestHistory(eff.key);
      break;
    case "list":
      requestList();
      break;
    case "flush":
      flushOutbox();
      break;
    case "approvals":
      requestApprovals();
      break;
    case "retry":
      setTimeout(flushOutbox, eff.afterMs);
      break;
    case "draft":
      if (eff.key === state.currentKey) setComposer(state.drafts[eff.key] || "");
      break;
    default:
      break;
  }
}

// --- connection ------------------------------------------------------------------------------------

const wsUrl = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}${root.dataset.wsPath || "/ws/gateway"}`;
const client = new GatewayClient({
  url: wsUrl,
  client: {
    id: "agentgate-web",
    version: root.dataset.version || "1",
    platform: "web",
    mode: "webchat",
    displayName: "agentgate web",
  },
  onConnecting: () => dispatch({ type: "conn/connecting" }),
  onOpen: () => dispatch({ type: "conn/open" }),
  // `at`: the page's clock when the frame arrived (approval countdowns, the server's clock offset).
  onEvent: (frame) => dispatch({ type: "event", frame, at: Date.now() }),
  onReady: (hello) => {
    // Subscribe before anything is read, so no change between the read and the subscription is missed.
    client.request("sessions.subscribe", {}).catch(() => {});
    dispatch({ type: "conn/ready", hello });
    requestAgents();
  },
  onClosed: ({ retryInMs }) => dispatch({ type: "conn/closed", retryInMs }),
  onFatal: (error) => {
    if (error.code === "UNAUTHORIZED") {
      const next = encodeURIComponent(location.pathname + location.hash);
      location.assign(`${root.dataset.loginUrl || "/login/"}?next=${next}`);
      return;
    }
    dispatch({ type: "conn/closed", retryInMs: null, error: error.message || error.code });
    dispatch({ type: "notice", text: `The gateway refused this page: ${error.message || error.code}` });
  },
});

// One chat.history per session at a time; a reload asked for meanwhile runs once after it.
const requestHistory = coalesce(
  (key) => {
    if (!client.ready || !key) return null;
    dispatch({ type: "history/request", key });
    const token = state.tick;
    return client
      .request("chat.history", { sessionKey: key, limit: PAGE_SIZE })
      .then((res) => {
        if (res.ok) dispatch({ type: "history/loaded", key, token, payload: res.payload });
        else dispatch({ type: "history/failed", key, error: res.error });
      })
      .catch((error) => dispatch({ type: "history/failed", key, error }));
  },
  { keyOf: (key) => key },
);

function requestOlder(key) {
  const conv = state.convs[key];
  if (!client.ready || !conv || !conv.loaded || !conv.hasMore || conv.loadingOlder || !conv.messages.length) return;
  dispatch({ type: "history/request", key, older: true });
  client
    .request("chat.history", { sessionKey: key, limit: PAGE_SIZE, beforeId: conv.messages[0].id })
    .then((res) => {
      if (res.ok) dispatch({ type: "history/loaded", key, token: 0, older: true, payload: res.payload });
      else dispatch({ type: "history/failed", key, error: res.error });
    })
    .catch((error) => dispatch({ type: "history/failed", key, error }));
}

// The sidebar's first page: one sessions.list at a time; a reload asked for meanwhile runs once after it.
const requestList = coalesce(() => {
  if (!client.ready) return null;
  const token = state.tick;
  const search = state.search;
  const params = { limit: LIST_LIMIT };
  if (search) params.search = search;
  return client
    .request("sessions.list", params)
    .then((res) => {
      if (res.ok) dispatch({ type: "list/loaded", token, search, offset: 0, payload: res.payload });
    })
    .catch(() => {});
});

/** The next page of the sidebar (sessions.list `offset`), when there is one; asked again while one loads: ignored. */
const requestMoreSessions = coalesce(
  () => {
    const next = state.listNext;
    if (!client.ready || !next || next.search !== state.search) return null;
    const token = state.tick;
    const params = { limit: LIST_LIMIT, offset: next.offset };
    if (next.search) params.search = next.search;
    return client
      .request("sessions.list", params)
      .then((res) => {
        if (res.ok) dispatch({ type: "list/loaded", token, search: next.search, offset: next.offset, payload: res.payload });
      })
      .catch(() => {});
  },
  { again: false },
);

// Pending approvals (TOOLS.md §13.5), after every (re)connect and seq gap: the answer replaces what the page holds.
const requestApprovals = coalesce(() => {
  if (!client.ready) return null;
  const token = state.tick;
  return client
    .request("plugin.approval.list", {})
    .then((res) => {
      if (res.ok) dispatch({ type: "approvals/listed", token, at: Date.now(), payload: res.payload });
    })
    .catch(() => {});
});

/** Send a decision (`allow-once` or `deny`) for approval `id`; the card shows the decision the gateway recorded. */
async function decideApproval(id, decision) {
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

function requestAgents() {
  client
    .request("agents.list", {})
    .then((res) => {
      if (res.ok) dispatch({ type: "agents/loaded", payload: res.payload });
    })
    .catch(() => {});
}

function flushOutbox() {
  for (const run of outbox(state)) {
    const { key, id } = run;
    dispatch({ type: "send/sent", key, runId: id, gen: state.conn.gen });
    client
      .request("chat.send", { sessionKey: key, message: run.userText, idempotencyKey: id })
      .then((response) => dispatch({ type: "send/ack", key, runId: id, response }))
      .catch((error) => {
        // No answer: the socket went away (or the request timed out). Same key, next connection.
        dispatch({ type: "send/unsent", key, runId: id });
        if (error.code !== "DISCONNECTED") setTimeout(flushOutbox, 1000);
      });
  }
}

// --- user actions ----------------------------------------------------------------------------------------

function newRunId() {
  const bytes = new Uint8Array(8);
  crypto.getRandomValues(bytes);
  const hex = Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  return `web-${Date.now().toString(36)}-${hex}`;
}

function sendComposer() {
  const text = els.composer.value;
  if (!text.trim()) return;
  const max = state.policy.maxMessageChars;
  if (text.length > max) {
    dispatch({ type: "notice", text: `Messages are limited to ${max} characters.` });
    return;
  }
  page.stickToBottom = true;
  dispatch({ type: "send/request", key: state.currentKey, runId: newRunId(), text });
  els.composer.focus();
}

/** Run the last reply again: the same user text through chat.send, with a new idempotency key. */
function retryLast() {
  const key = state.currentKey;
  const target = retryTarget(state, key);
  if (!target || !target.enabled) return;
  // A refused send put its text back in the composer: the retry takes it from there.
  const keepDraft = els.composer.value !== target.text;
  page.stickToBottom = true;
  dispatch({ type: "send/request", key, runId: newRunId(), text: target.text, keepDraft });
}

/** Put the last user message back in the composer, to change it and send it again. */
function editLast() {
  const key = state.currentKey;
  const target = editTarget(state, key);
  if (!target) return;
  setComposer(target.text);
  dispatch({ type: "draft/set", key, text: target.text });
  els.composer.focus();
  els.composer.setSelectionRange(target.text.length, target.text.length);
}

async function copyText(text, button) {
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

async function stopRuns() {
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

async function cancelQueued(key, runId) {
  await call("chat.abort", { sessionKey: key, runId }, "Cancel");
}

/** A notice saying what failed (`failureText`); a fault in this page also goes to the console, with its stack. */
function reportFailure(what, error) {
  if (!(error && error.name === "RequestError") && error instanceof Error) console.error(error);
  dispatch({ type: "notice", text: failureText(what, error) });
}

/** One request whose failure becomes a notice saying what failed; its payload, or null. */
async function call(method, params, what = method) {
  let res;
  try {
    res = await client.request(method, params);
  } catch (error) {
    reportFailure(what, error); // no answer: not connected, timed out, or a fault in this page
    return null;
  }
  if (!res.ok) {
    reportFailure(what, res.error); // the gateway's own error
    return null;
  }
  return res.payload;
}

/** A user action whose own exceptions (faults in this page, not gateway errors) become a notice naming them. */
function guarded(what, action) {
  return async (...args) => {
    try {
      await action(...args);
    } catch (error) {
      reportFailure(what, error);
    }
  };
}

function selectSession(key) {
  closeSidebar();
  if (needsApproval(state, key)) page.revealApproval = key;
  if (key === state.currentKey) {
    scheduleRender();
    return;
  }
  page.stickToBottom = true;
  dispatch({ type: "session/select", key });
}

async function newSession() {
  const params = {};
  if (state.agents && state.agents.list.length > 1 && els.agentPicker.value) params.agentId = els.agentPicker.value;
  const payload = await call("sessions.create", params);
  if (!payload) return;
  dispatch({ type: "session/row", row: payload.session });
  selectSession(payload.session.key);
  els.composer.focus();
}

function currentLabel() {
  const row = state.rows[state.currentKey];
  return (row && row.label) || shortName(state.currentKey);
}

async function renameSession() {
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

async function resetSession() {
  const key = state.currentKey;
  const ok = await ask({
    title: "Reset this session?",
    text: `“${currentLabel()}” starts over with an empty conversation. Running and queued messages are stopped.`,
    confirm: "Reset",
    danger: true,
  });
  if (!ok) return;
  const payload = await call("sessions.reset", { sessionKey: key });
  if (!payload) return;
  dispatch({ type: "session/row", row: payload.session });
  requestHistory(key);
}

async function deleteSession() {
  const key = state.currentKey;
  const ok = await ask({
    title: "Delete this session?",
    text: `“${currentLabel()}” and all its messages are deleted. This cannot be undone.`,
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

// --- dialog -------------------------------------------------------------------------------------------------

function ask({ title, text = "", input = null, inputLabel = "", confirm = "OK", danger = false }) {
  const d = els.dialog;
  els.dialogTitle.textContent = title;
  els.dialogText.textContent = text;
  els.dialogText.hidden = !text;
  els.dialogInput.hidden = input === null;
  els.dialogLabel.hidden = input === null;
  els.dialogLabel.textContent = inputLabel;
  els.dialogInput.value = input === null ? "" : input;
  els.dialogConfirm.textContent = confirm;
  d.dataset.danger = String(danger);
  d.returnValue = "";
  return new Promise((resolve) => {
    const onClose = () => {
      d.removeEventListener("close", onClose);
      const ok = d.returnValue === "ok";
      resolve(ok ? (input === null ? true : els.dialogInput.value) : null);
    };
    d.addEventListener("close", onClose);
    d.showModal();
    if (input !== null) {
      els.dialogInput.focus();
      els.dialogInput.select();
    } else {
      els.dialogConfirm.focus();
    }
  });
}

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

// --- sidebar (phone) ------------------------------------------------------------------------------------------

// At phone width the closed sidebar is visibility:hidden (app.css), so it takes no keyboard focus.
// Opening it moves focus into it; closing it gives focus back to the toggle.

function sidebarIsOpen() {
  return document.body.classList.contains("sidebar-open");
}

function openSidebar() {
  document.body.classList.add("sidebar-open");
  els.sidebarToggle.setAttribute("aria-expanded", "true");
  const current = els.sessionList.querySelector('[aria-current="true"]');
  (current || els.newSession).focus();
}

function closeSidebar() {
  if (!sidebarIsOpen()) return;
  document.body.classList.remove("sidebar-open");
  els.sidebarToggle.setAttribute("aria-expanded", "false");
  if (getComputedStyle(els.sidebarToggle).display !== "none") els.sidebarToggle.focus();
}

// --- rendering --------------------------------------------------------------------------------------------------

function scheduleRender() {
  if (page.renderPending) return;
  page.renderPending = true;
  Promise.resolve().then(() => {
    page.renderPending = false;
    render();
  });
}

const STATUS_TEXT = {
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

function render() {
  renderConnection();
  renderAgents();
  renderSessions();
  renderHeader();
  renderMessages();
  renderComposer();
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
  if (els.conn.textContent !== text) els.conn.textContent = text;
}

function agentOf(agentId) {
  const list = (state.agents && state.agents.list) || [];
  return list.find((a) => a.id === agentId) || null;
}

function renderAgents() {
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

function renderSessions() {
  const items = sessionList(state);
  updateKeyed(els.sessionList, page.rowEls, items, (item) => item.key, sessionElement, updateSessionElement);
  els.sessionEmpty.hidden = items.length > 0;
  els.loadMoreSessions.hidden = !(state.listNext && state.listNext.search === state.search);
}

function renderHeader() {
  const key = state.currentKey;
  const row = state.rows[key];
  const label = currentLabel();
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

function metaFor(item) {
  switch (item.state) {
    case "sending":
      return { text: state.conn.status === "online" ? "Sending…" : "Waiting for the connection…" };
    case "queued":
      return { text: item.position ? `Queued · #${item.position}` : "Queued", cancel: true };
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
  const actions = item.role === "user" ? [["copy", "Copy"], ["edit", "Edit"], ["retry", "Retry"]] : [["copy", "Copy"], ["retry", "Retry"]];
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
  row.append(el, foot);
  return row;
}

function renderMessages() {
  const box = els.messages;
  const key = state.currentKey;
  if (page.renderedKey !== key) {
    for (const el of page.msgEls.values()) el.remove();
    page.msgEls.clear();
    page.renderedKey = key;
    page.stickToBottom = true;
  }
  const items = conversation(state, key);
  const retry = retryTarget(state, key, items);
  const edit = editTarget(state, key, items);
  const conv = state.convs[key];
  const nearBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
  const heightBefore = box.scrollHeight;
  const firstBefore = els.messageList.firstChild;
  const now = Date.now();
  updateKeyed(els.messageList, page.msgEls, items, (item) => item.id, messageElement, (row, item) => {
    if (item.role === "tool") {
      row.dataset.itemId = item.id;
      updateToolCard(row, item.view, { now });
      return;
    }
    const el = row.firstChild;
    const foot = row.lastChild;
    row.dataset.itemId = item.id;
    setAttr(row, "data-role", item.role);
    setAttr(el, "data-role", item.role);
    setAttr(el, "data-state", item.state);
    setAttr(el, "data-run-id", item.runId || "");
    setAttr(el, "data-position", item.position ? String(item.position) : "");
    const body = el.children[0];
    if (body.dataset.testid === "markdown") renderMarkdown(body, item.text, { final: item.state !== "streaming" });
    else setText(body, item.text);
    const meta = metaFor(item);
    const metaEl = el.children[1];
    const signature = meta ? `${meta.text}|${meta.cancel ? 1 : 0}` : "";
    if (metaEl.dataset.sig !== signature) {
      metaEl.dataset.sig = signature;
      metaEl.replaceChildren();
      metaEl.hidden = !meta;
      if (meta) {
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
    }
    const ended = item.state === "final" || item.state === "aborted" || item.state === "error";
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
      editBtn.hidden = !(edit && edit.itemId === item.id);
      setAttr(editBtn, "aria-label", "Edit your last message");
    }
    retryBtn.hidden = !(retry && retry.itemId === item.id);
    retryBtn.disabled = !(retry && retry.enabled);
    setAttr(retryBtn, "aria-label", "Run the last message again");
    foot.hidden = [...foot.children].every((child) => child.hidden);
  });
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
  if (page.revealApproval === key && conv && conv.loaded) {
    // Opened from its "needs approval" row: show the prompt (no focus move: a stray Enter must not decide).
    const prompt = els.messageList.querySelector('[data-testid="tool-approval"][data-state="pending"]');
    if (prompt) prompt.scrollIntoView({ block: "center" });
    page.revealApproval = null;
  } else if (page.revealApproval && page.revealApproval !== key) {
    page.revealApproval = null;
  }
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

function renderComposer() {
  const act = activity(state, state.currentKey);
  els.stop.hidden = !act.active;
  els.stop.disabled = page.stopping;
  els.send.disabled = !els.composer.value.trim();
  let text = "";
  let kind = "";
  if (state.conn.status !== "online" && act.pending) {
    text = "Offline: your message goes out when the connection is back.";
    kind = "warn";
  } else if (act.active) {
    const doing = needsApproval(state, state.currentKey) ? "Waiting for your approval…" : "Replying…";
    text = act.queued ? `${doing} · ${act.queued} queued` : doing;
  } else if (act.queued) {
    text = `${act.queued} queued`;
  } else if (act.pending) {
    text = "Sending…";
  }
  setText(els.status, text);
  setAttr(els.status, "data-kind", kind);
  els.send.title = act.active ? "Send (it waits behind the current reply)" : "Send";
}

function renderNotice() {
  const notice = state.notice;
  els.notice.hidden = !notice;
  if (notice) setText(els.noticeText, notice.text);
}

function setText(el, text) {
  if (el.textContent !== text) el.textContent = text;
}

function setAttr(el, name, value) {
  if (value === "" || value == null) {
    if (el.hasAttribute(name)) el.removeAttribute(name);
  } else if (el.getAttribute(name) !== value) {
    el.setAttribute(name, value);
  }
}

function setComposer(text) {
  if (els.composer.value !== text) els.composer.value = text;
  autosize();
  scheduleRender();
}

function autosize() {
  els.composer.style.height = "auto";
  els.composer.style.height = `${Math.min(els.composer.scrollHeight, window.innerHeight * 0.4)}px`;
}

// --- wiring ---------------------------------------------------------------------------------------------------

els.form.addEventListener("submit", (ev) => {
  ev.preventDefault();
  sendComposer();
});
els.composer.addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey && !ev.altKey && !ev.ctrlKey && !ev.metaKey && !ev.isComposing) {
    ev.preventDefault();
    sendComposer();
  }
});
els.composer.addEventListener("input", () => {
  autosize();
  dispatch({ type: "draft/set", key: state.currentKey, text: els.composer.value });
});
els.stop.addEventListener("click", stopRuns);
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
  if (action === "copy") {
    const item = conversation(state, state.currentKey).find((i) => i.id === row.dataset.itemId);
    if (item) copyText(item.text, button);
  } else if (action === "retry") {
    retryLast();
  } else if (action === "edit") {
    editLast();
  }
});
els.search.addEventListener("input", () => {
  clearTimeout(page.searchTimer);
  page.searchTimer = setTimeout(() => {
    if (els.search.value.trim() !== state.search) dispatch({ type: "search/set", text: els.search.value });
  }, SEARCH_DEBOUNCE_MS);
});
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

// For tests and debugging: a read-only look at the state.
Object.defineProperty(window, "agentgate", { value: { get state() { return state; } } });

// Messages that were waiting for the connection when the page was closed go out once, with
// the same idempotency key (the server answers a resend of one that did go out with its ack).
for (const item of loadStored("outbox", [])) {
  if (item && typeof item.key === "string" && typeof item.runId === "string" && typeof item.text === "string") {
    dispatch({ type: "send/request", key: item.key, runId: item.runId, text: item.text, restored: true });
  }
}
setComposer(state.drafts[state.currentKey] || "");
render();
client.start();
els.composer.focus();
