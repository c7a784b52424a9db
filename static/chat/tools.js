// Tool calls and approvals (TOOLS.md §13) for the chat page's state module.
//
// Pure: no DOM, no timers, no I/O. The reducer's modules (state.js and its table) call the `on…`
// functions with the draft state `s` they are building (they replace `s.tools` / `s.approvals` with
// new objects, never change the old ones), and the conversation reads the selectors. The clock is an input: an event's
// action carries `at`, the page's time when it arrived. What a card shows is toolview.js's.
//
// The rules that matter:
// - a call's `result` is its one terminal state: a start, update or second result for a call that
//   has ended changes nothing (only what it lacked, such as its arguments, is filled in);
// - a call never spins after its run ended: the run's terminal marks its open calls `runEnded`
//   (the server still sends their results, which then show);
// - an approval shows the decision the gateway recorded, whoever made it (another tab, expiry, abort).

import { TERMINAL_PHASES, effect, inTranscript, runOf } from "./model.js";
import { failureText } from "./texts.js";

/** Terminal states of a tool call (§13.2); `client`: a call of an API client's own tool, handed to it, never run here. */
export const TOOL_TERMINAL = new Set(["succeeded", "failed", "denied", "expired", "cancelled", "unknown", "client", "skipped"]);
/** States of a call still going on. */
export const TOOL_OPEN = new Set(["running", "pending_approval"]);
/** Decisions a user may send (`plugin.approval.resolve`). */
export const USER_DECISIONS = ["allow-once", "deny"];

/** The tool part of the initial state. */
export function initialToolState() {
  return {
    tools: {}, // toolCallId -> call (see newCall)
    approvals: {}, // approval id -> approval (see approvalFrom)
    clockOffsetMs: null, // the server's clock minus the page's (from connect.challenge / tick `ts`), or null
  };
}

const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
const str = (v) => (typeof v === "string" && v ? v : null);
function runIsOver(s, key, runId) {
  const run = runOf(s, key, runId);
  return Boolean(run) && TERMINAL_PHASES.has(run.phase);
}

function putCall(s, call) {
  s.tools = { ...s.tools, [call.id]: call };
  return call;
}

function putApproval(s, approval) {
  s.approvals = { ...s.approvals, [approval.id]: { ...approval, _seen: s.tick } };
  return s.approvals[approval.id];
}

function newCall(s, id, { key, runId = null, sessionId = null, name = "", args } = {}) {
  s.order += 1;
  return {
    id,
    key: key || null,
    sessionId: sessionId || null,
    runId: runId || null,
    name: name || "",
    args, // an object, or a string when the model sent arguments that are not JSON; undefined: not known
    status: "running", // running | pending_approval | a TOOL_TERMINAL state
    isError: false,
    errorKind: null, // why it ended other than succeeded (`errorKind`), once ended
    result: null, // the result's text, once ended
    progress: null, // {progress, total, message} from `update`
    approvalId: null,
    runEnded: false, // the run ended while the call was open: shown as ended, never spinning
    order: s.order, // call order (first sight)
  };
}

/** The call `id`, created when unknown; fields the call lacks are filled in from `info`. */
function callFor(s, id, info) {
  const known = s.tools[id];
  if (!known) {
    const call = newCall(s, id, info);
    call.runEnded = runIsOver(s, call.key, call.runId);
    return { call, created: true };
  }
  const call = { ...known };
  if (!call.key && info.key) call.key = info.key;
  if (!call.runId && info.runId) call.runId = info.runId;
  if (!call.sessionId && info.sessionId) call.sessionId = info.sessionId;
  if (!call.name && info.name) call.name = info.name;
  if (call.args === undefined && info.args !== undefined) call.args = info.args;
  return { call, created: false };
}

/** Text of a tool result: `{content: [...]}`, a content list, or a string. Non-text blocks are named. */
export function resultText(result) {
  if (result == null) return "";
  if (typeof result === "string") return result;
  const content = Array.isArray(result) ? result : isObject(result) && Array.isArray(result.content) ? result.content : null;
  if (!content) return isObject(result) && typeof result.text === "string" ? result.text : "";
  return content
    .map((block) => {
      if (!isObject(block)) return typeof block === "string" ? block : "";
      if (block.type === "text" || typeof block.text === "string") return String(block.text ?? "");
      return `[${block.type || "content"}]`;
    })
    .join("\n");
}

function terminalStatus(status, isError) {
  if (TOOL_TERMINAL.has(status)) return status;
  return isError ? "failed" : "succeeded"; // a result is terminal whatever it says
}

function normalizeProgress(partial) {
  if (!isObject(partial)) return null;
  const progress = Number(partial.progress);
  const total = Number(partial.total);
  const out = {
    progress: Number.isFinite(progress) ? progress : null,
    total: Number.isFinite(total) && total > 0 ? total : null,
    message: typeof partial.message === "string" ? partial.message : null,
  };
  return out.progress == null && out.message == null ? null : out;
}

/** End call `id` with its one recorded outcome; a call that has ended already stays as it was. */
function finishCall(s, id, info, { status, isError, errorKind, result }) {
  const { call, created } = callFor(s, id, info);
  if (!created && TOOL_TERMINAL.has(s.tools[id].status)) {
    if (call.args !== s.tools[id].args || call.name !== s.tools[id].name) putCall(s, call); // filled in, not re-opened
    return { call: s.tools[id], created };
  }
  call.status = terminalStatus(status, Boolean(isError));
  call.isError = Boolean(isError) || call.status === "failed";
  call.errorKind = str(errorKind);
  call.result = resultText(result);
  call.progress = null;
  return { call: putCall(s, call), created };
}

/** Did this page see run `runId` of `key` anywhere (its runs, or the loaded transcript)? */
function runKnown(s, key, runId) {
  return !runId || Boolean(runOf(s, key, runId)) || inTranscript(s, key, runId);
}

// --- events ----------------------------------------------------------------------------------------

/**
 * An `agent` event (`stream` "tool" or "approval"); other streams are ignored. A call of a run of
 * the open session this page has not seen asks for a history reload.
 */
export function onAgentEvent(s, p) {
  if (!isObject(p) || typeof p.sessionKey !== "string" || !isObject(p.data)) return;
  const data = p.data;
  const id = str(data.toolCallId);
  if (!id) return;
  const info = { key: p.sessionKey, runId: str(p.runId), sessionId: str(p.sessionId), name: str(data.name) };
  let created = false;
  if (p.stream === "tool") {
    if (data.phase === "start") {
      const r = callFor(s, id, { ...info, args: data.args });
      created = r.created;
      if (r.created || !TOOL_TERMINAL.has(r.call.status) || r.call.args !== s.tools[id].args || r.call.name !== s.tools[id].name) putCall(s, r.call);
    } else if (data.phase === "update") {
      const r = callFor(s, id, info);
      created = r.created;
      if (TOOL_TERMINAL.has(r.call.status)) return;
      const progress = normalizeProgress(data.partialResult);
      if (progress) r.call.progress = progress;
      putCall(s, r.call);
    } else if (data.phase === "result") {
      created = finishCall(s, id, info, { status: data.status, isError: data.isError, errorKind: data.errorKind, result: data.result }).created;
    } else {
      return;
    }
  } else if (p.stream === "approval") {
    const approvalId = str(data.approvalId);
    if (!approvalId) return;
    if (data.phase === "requested") {
      created = !s.tools[id];
      const known = s.approvals[approvalId];
      if (!known) putApproval(s, approvalFrom({ id: approvalId, request: { toolCallId: id, sessionKey: info.key, runId: info.runId } }, null));
      linkCall(s, s.approvals[approvalId], info);
    } else if (data.phase === "resolved") {
      created = !s.tools[id];
      resolveApproval(s, approvalId, { decision: str(data.status), request: { toolCallId: id, sessionKey: info.key, runId: info.runId } });
    } else {
      return;
    }
  } else {
    return;
  }
  if (created && info.key === s.currentKey && !runKnown(s, info.key, info.runId)) {
    effect(s, { type: "history", key: info.key }); // a run from elsewhere: its user message comes with history
  }
}

function approvalFrom(p, deadline) {
  const request = isObject(p.request) ? p.request : {};
  const mcp = isObject(request.mcpTool) ? request.mcpTool : null;
  const allowed = Array.isArray(request.allowedDecisions) ? request.allowedDecisions.filter((d) => USER_DECISIONS.includes(d)) : null;
  return {
    id: p.id,
    toolCallId: str(request.toolCallId),
    key: str(request.sessionKey),
    runId: str(request.runId),
    agentId: str(request.agentId),
    title: typeof request.title === "string" ? request.title : "",
    description: typeof request.description === "string" ? request.description : "",
    severity: str(request.severity),
    toolName: str(request.toolName) || (mcp && mcp.server && mcp.tool ? `${mcp.server}.${mcp.tool}` : null),
    allowedDecisions: allowed && allowed.length ? allowed : [...USER_DECISIONS],
    createdAtMs: Number.isFinite(p.createdAtMs) ? p.createdAtMs : null,
    expiresAtMs: Number.isFinite(p.expiresAtMs) ? p.expiresAtMs : null,
    deadline, // when it expires, on the page's clock (ms), or null when not known
    status: "pending", // pending | resolved
    decision: null, // the recorded decision once resolved (null: resolved, decision not known)
    resolvedBy: null,
    resolvedAt: null,
    sending: null, // the decision being sent from this page
    error: null, // why the last decision from this page did not go through
  };
}

/** Make the approval's call show it: created from the request when unknown, waiting while it is pending. */
function linkCall(s, approval, info = {}) {
  const id = approval.toolCallId;
  if (!id) return;
  const { call } = callFor(s, id, {
    key: approval.key || info.key,
    runId: approval.runId || info.runId,
    sessionId: info.sessionId,
    name: approval.toolName || info.name,
  });
  call.approvalId = approval.id;
  if (!TOOL_TERMINAL.has(call.status)) {
    if (approval.status === "pending") call.status = "pending_approval";
    else if (approval.decision === "allow-once" || approval.decision === null) {
      if (call.status === "pending_approval") call.status = "running"; // allowed (or decided while away): it runs now
    }
  }
  putCall(s, call);
}

/** Fill in a pending approval from `plugin.approval.requested` or `plugin.approval.list`. */
function acceptApproval(s, p, deadline) {
  if (!isObject(p) || !str(p.id)) return null;
  const fresh = approvalFrom(p, deadline);
  const known = s.approvals[p.id];
  let approval;
  if (!known) approval = fresh;
  else {
    // Details from the full object; what this page learned (a decision, a deadline, a send) stays.
    approval = { ...known };
    for (const field of ["toolCallId", "key", "runId", "agentId", "severity", "toolName", "createdAtMs", "expiresAtMs"]) {
      if (approval[field] == null && fresh[field] != null) approval[field] = fresh[field];
    }
    if (!approval.title) approval.title = fresh.title;
    if (!approval.description) approval.description = fresh.description;
    if (isObject(p.request) && Array.isArray(p.request.allowedDecisions)) approval.allowedDecisions = fresh.allowedDecisions;
    if (approval.deadline == null) approval.deadline = deadline;
  }
  approval = putApproval(s, approval);
  linkCall(s, approval);
  return approval;
}

/** `plugin.approval.requested`: `at` is the page's clock when it arrived (its `createdAtMs` is the server's "now"). */
export function onApprovalRequested(s, p, at) {
  if (!isObject(p)) return;
  let deadline = null;
  if (Number.isFinite(at) && Number.isFinite(p.expiresAtMs) && Number.isFinite(p.createdAtMs)) {
    deadline = at + Math.max(0, p.expiresAtMs - p.createdAtMs);
  }
  acceptApproval(s, p, deadline);
}

/**
 * Record approval `id` as resolved with `decision` (null: resolved, decision not known). The first
 * recorded decision stays: a later one for the same approval changes nothing.
 */
function resolveApproval(s, id, { decision = null, resolvedBy = null, ts = null, request = null, error = null } = {}) {
  let approval = s.approvals[id];
  if (!approval) approval = approvalFrom({ id, request: request || {} }, null);
  else if (request) {
    const fresh = approvalFrom({ id, request }, null);
    approval = { ...approval };
    for (const field of ["toolCallId", "key", "runId", "toolName"]) if (approval[field] == null) approval[field] = fresh[field];
    if (!approval.title) approval.title = fresh.title;
    if (!approval.description) approval.description = fresh.description;
  }
  const already = approval.status === "resolved" && approval.decision !== null;
  approval = {
    ...approval,
    status: "resolved",
    decision: already ? approval.decision : decision,
    resolvedBy: already ? approval.resolvedBy : resolvedBy || approval.resolvedBy,
    resolvedAt: already ? approval.resolvedAt : ts ?? approval.resolvedAt,
    sending: null,
    error,
  };
  approval = putApproval(s, approval);
  linkCall(s, approval);
  return approval;
}

/** `plugin.approval.resolved` `{id, decision, resolvedBy, ts, request}`. */
export function onApprovalResolved(s, p) {
  if (!isObject(p) || !str(p.id)) return;
  resolveApproval(s, p.id, { decision: str(p.decision), resolvedBy: str(p.resolvedBy), ts: Number.isFinite(p.ts) ? p.ts : null, request: isObject(p.request) ? p.request : null });
}

/**
 * The answer to `plugin.approval.list` (an array of pending approvals), asked at request tick
 * `token`. It replaces what this page holds as pending: one it does not list was resolved while
 * the page was not looking (the decision is not known here; the call's result says the rest),
 * unless it arrived after the request went out.
 */
export function onApprovalsListed(s, { payload, token = Infinity, at } = {}) {
  const list = Array.isArray(payload) ? payload : isObject(payload) && Array.isArray(payload.approvals) ? payload.approvals : [];
  const listed = new Set();
  for (const p of list) {
    if (!isObject(p) || !str(p.id)) continue;
    listed.add(p.id);
    let deadline = null;
    if (Number.isFinite(p.expiresAtMs)) {
      if (s.clockOffsetMs != null) deadline = p.expiresAtMs - s.clockOffsetMs;
      else if (Number.isFinite(at) && Number.isFinite(p.createdAtMs)) deadline = at + Math.max(0, p.expiresAtMs - p.createdAtMs);
    }
    const known = s.approvals[p.id];
    if (known && known.status === "resolved") {
      if (known.decision !== null) continue; // decided since the server read its list: the decision stays
      // Thought gone (an earlier list did not have it), yet the server has it pending: it is.
      putApproval(s, { ...known, status: "pending", error: null });
    }
    acceptApproval(s, p, deadline);
  }
  for (const approval of Object.values(s.approvals)) {
    if (approval.status !== "pending" || listed.has(approval.id) || approval._seen > token) continue;
    resolveApproval(s, approval.id);
  }
}

/** A decision goes out from this page: the buttons are disabled until it is answered. */
export function onApprovalSending(s, { id, decision }) {
  const approval = s.approvals[id];
  if (!approval || approval.status !== "pending" || approval.sending || !USER_DECISIONS.includes(decision)) return;
  putApproval(s, { ...approval, sending: decision, error: null });
}

/**
 * The answer to `plugin.approval.resolve`. `response` is the response frame; `errorText` the
 * words for a failure (no answer, or the gateway's error). The recorded decision is shown, which may
 * differ from the one sent (someone else decided first, or it expired).
 */
export function onApprovalAnswered(s, { id, response, errorText = null }) {
  const approval = s.approvals[id];
  if (response && response.ok && isObject(response.payload)) {
    const p = response.payload;
    resolveApproval(s, str(p.id) || id, { decision: str(p.decision), resolvedBy: str(p.resolvedBy), ts: Number.isFinite(p.ts) ? p.ts : null, request: isObject(p.request) ? p.request : null });
    return;
  }
  if (!approval) return;
  const code = response && response.error && response.error.code;
  if (code === "NOT_FOUND") {
    resolveApproval(s, id, { error: "The gateway no longer knows this approval." });
    return;
  }
  putApproval(s, { ...approval, sending: null, error: errorText || "The decision was not recorded." });
}

/** The server's clock from a frame's `ts` (connect.challenge, tick) that arrived at `at` (page clock). */
export function onServerTime(s, ts, at) {
  if (Number.isFinite(ts) && Number.isFinite(at)) s.clockOffsetMs = ts - at;
}

/** Run `runId` of `key` ended: its open calls stop spinning (their results still come and show). */
export function endRunTools(s, key, runId) {
  let tools = null;
  for (const call of Object.values(s.tools)) {
    if (call.key !== key || call.runId !== runId || call.runEnded || TOOL_TERMINAL.has(call.status)) continue;
    tools = tools || { ...s.tools };
    tools[call.id] = { ...call, runEnded: true };
  }
  if (tools) s.tools = tools;
}

/** Session `key` is gone (deleted): its calls and approvals go with it. */
export function dropSessionTools(s, key) {
  const tools = {};
  for (const [id, call] of Object.entries(s.tools)) if (call.key !== key) tools[id] = call;
  s.tools = tools;
  const approvals = {};
  for (const [id, a] of Object.entries(s.approvals)) if (a.key !== key) approvals[id] = a;
  s.approvals = approvals;
}

/** The reducer's actions of approvals (state.js puts them in its table). */
export const approvalHandlers = {
  // plugin.approval.list answered (asked at tick `token`): it replaces the pending approvals.
  "approvals/listed": onApprovalsListed,
  "approval/sending": onApprovalSending,
  "approval/answered": (s, action) => {
    // plugin.approval.resolve answered (`response`) or not (`error`, a RequestError).
    const what = action.decision === "deny" ? "Deny" : "Allow once";
    const response = action.response || null;
    const error = response ? response.error : action.error;
    onApprovalAnswered(s, { id: action.id, response, errorText: response && response.ok ? null : failureText(what, error) });
  },
};

// --- history -----------------------------------------------------------------------------------------

/**
 * Tool activity in a `chat.history` page of `key` (§13.4): `toolCall` blocks of assistant messages,
 * `toolResult` messages, and `inFlight.tools` of the run still open. A call found there with no result,
 * of a run that is not the one in flight, ended with its run.
 */
export function ingestHistory(s, key, messages, { sessionId = null, inFlight = null } = {}) {
  const openRun = inFlight && typeof inFlight.runId === "string" ? inFlight.runId : null;
  const seen = [];
  for (const m of messages) {
    if (!isObject(m) || !Array.isArray(m.content)) continue;
    const runId = str(m.runId);
    if (m.role === "assistant") {
      for (const block of m.content) {
        if (!isObject(block) || block.type !== "toolCall" || !str(block.id)) continue;
        const { call, created } = callFor(s, block.id, { key, runId, sessionId, name: str(block.name), args: block.arguments });
        if (created || call.args !== s.tools[block.id].args || call.name !== s.tools[block.id].name) putCall(s, call);
        seen.push(block.id);
      }
    } else if (m.role === "toolResult" && str(m.toolCallId)) {
      finishCall(s, m.toolCallId, { key, runId, sessionId, name: str(m.toolName) }, { status: m.status, isError: m.isError, errorKind: m.errorKind, result: m.content });
      seen.push(m.toolCallId);
    }
  }
  if (openRun && Array.isArray(inFlight.tools)) {
    for (const t of inFlight.tools) {
      if (!isObject(t) || !str(t.toolCallId)) continue;
      const info = { key, runId: openRun, sessionId, name: str(t.name), args: t.args };
      if (TOOL_TERMINAL.has(t.status)) {
        finishCall(s, t.toolCallId, info, { status: t.status, isError: t.isError, errorKind: t.errorKind, result: t.result });
        continue;
      }
      const { call } = callFor(s, t.toolCallId, info);
      if (TOOL_TERMINAL.has(call.status)) continue;
      if (TOOL_OPEN.has(t.status)) {
        const approval = call.approvalId ? s.approvals[call.approvalId] : null;
        // A decision this page saw is newer than the history read: it keeps the call running.
        if (!(t.status === "pending_approval" && approval && approval.status === "resolved")) call.status = t.status;
      }
      call.runEnded = false; // the run is open
      putCall(s, call);
    }
  }
  for (const id of seen) {
    const call = s.tools[id];
    // In the transcript with no result, and not of the run in flight: its run had ended when history was read.
    if (!call || call.runId === openRun || call.runEnded || TOOL_TERMINAL.has(call.status)) continue;
    putCall(s, { ...call, runEnded: true });
  }
}

// --- selectors ---------------------------------------------------------------------------------------

/** The approval of `call`, if any: by its id, else the one naming the call. */
export function approvalOf(state, call) {
  if (!call) return null;
  if (call.approvalId && state.approvals[call.approvalId]) return state.approvals[call.approvalId];
  for (const a of Object.values(state.approvals)) if (a.toolCallId === call.id) return a;
  return null;
}

/** Approvals waiting for a decision, of session `key` (all sessions when `key` is null), oldest first. */
export function pendingApprovals(state, key = null) {
  return Object.values(state.approvals)
    .filter((a) => a.status === "pending" && (key === null || a.key === key))
    .filter((a) => {
      const call = a.toolCallId ? state.tools[a.toolCallId] : null;
      return !call || (!TOOL_TERMINAL.has(call.status) && !call.runEnded);
    })
    .sort((a, b) => (a.createdAtMs || 0) - (b.createdAtMs || 0));
}

/**
 * Does session `key` wait for an approval? Its row says so (`waitingFor`, TOOLS.md §13.2) for a run
 * this page has not seen end, or this page holds a pending approval of it.
 */
export function needsApproval(state, key) {
  const row = state.rows[key];
  if (row && row.waitingFor === "approval") {
    const ids = row.activeRunIds || [];
    const open = ids.length === 0 || ids.some((id) => !runIsOver(state, key, id));
    if (open) return true;
  }
  return pendingApprovals(state, key).length > 0;
}
