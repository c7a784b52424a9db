// Chat page state: a pure reducer over protocol v4 frames and user actions.
//
// No DOM, no timers, no I/O: `reduce(state, action)` returns a new state, and
// whatever must happen outside (a history reload, putting a draft back in the
// composer, a retry) is listed in `state.effects` for the caller to carry out.
// The page (app.js) and the Node unit tests (tests/js/) both import this file.
//
// The rule that matters most (PROTOCOL.md §4): a chat.send ack is a tagged
// union. `started` / `queued` / `in_flight` keep the run pending; `ok` completes
// it at once; `timeout` / `error` end it, clear the pending state and show the
// failure. A terminal ack is never followed by events, so nothing may wait for
// them.
//
// Tool calls and approvals (TOOLS.md §13) live in tools.js; this module feeds them the frames and
// history, and places the tool cards in the conversation.

import {
  TOOL_TERMINAL,
  approvalOf,
  endRunTools,
  ingestHistory,
  initialToolState,
  needsApproval,
  onAgentEvent,
  onApprovalAnswered,
  onApprovalRequested,
  onApprovalResolved,
  onApprovalSending,
  onApprovalsListed,
  onServerTime,
  toolCardView,
} from "./tools.js";

export { formatTimeLeft, needsApproval, pendingApprovals } from "./tools.js";

export const TERMINAL_PHASES = new Set(["final", "error", "aborted"]);
export const PENDING_PHASES = new Set(["sending", "queued", "started", "streaming"]);
const ACTIVE_PHASES = new Set(["started", "streaming"]);

/**
 * What the page must not copy from the server: the message limit and the key patterns.
 * These defaults hold until `hello-ok.policy` arrives; `policyFrom(hello)` replaces them.
 */
export const DEFAULT_POLICY = Object.freeze({
  maxMessageChars: 32000,
  keyNameRe: /^[A-Za-z0-9._:-]{1,200}$/,
  agentIdRe: /^[A-Za-z0-9_-]{1,64}$/,
});

function patternOr(source, fallback) {
  if (typeof source !== "string" || !source) return fallback;
  try {
    return new RegExp(source);
  } catch {
    return fallback; // not a JavaScript pattern: keep the built-in one
  }
}

/** The page's policy from a `hello-ok` frame, field by field, falling back to the defaults. */
export function policyFrom(hello) {
  const p = (hello && hello.policy) || {};
  const max = Number(p.maxMessageChars);
  return {
    maxMessageChars: Number.isInteger(max) && max > 0 ? max : DEFAULT_POLICY.maxMessageChars,
    keyNameRe: patternOr(p.sessionKeyNamePattern, DEFAULT_POLICY.keyNameRe),
    agentIdRe: patternOr(p.agentIdPattern, DEFAULT_POLICY.agentIdRe),
  };
}

/** Canonical session key (§3): a bare name means `agent:main:<name>`. Null when invalid. */
export function canonicalKey(raw, defaultAgent = "main", policy = DEFAULT_POLICY) {
  if (typeof raw !== "string" || !raw) return null;
  if (raw.startsWith("agent:")) {
    const parts = raw.split(":");
    if (parts.length < 3) return null;
    const agent = parts[1];
    const name = parts.slice(2).join(":");
    if (!policy.agentIdRe.test(agent) || !policy.keyNameRe.test(name)) return null;
    return `agent:${agent}:${name}`;
  }
  return policy.keyNameRe.test(raw) ? `agent:${defaultAgent}:${raw}` : null;
}

/** The short name of a session key, for display. */
export function shortName(key) {
  const parts = String(key).split(":");
  return parts.length >= 3 ? parts.slice(2).join(":") : String(key);
}

/** True when event `seq` does not follow `lastSeq` (§1): events were lost, resync. */
export function isSeqGap(lastSeq, seq) {
  return lastSeq > 0 && seq !== lastSeq + 1;
}

export function initialState({ currentKey = null, mainKey = "agent:main:main", drafts = {} } = {}) {
  return {
    tick: 0,
    conn: { status: "connecting", gen: 0, lastSeq: 0, retryInMs: null, user: null, error: null },
    mainKey,
    currentKey: currentKey || mainKey,
    rows: {}, // key -> session row (+ _seen: tick it was stored at)
    tombstones: {}, // key -> {createdAt, version} of a deleted session
    listLoaded: false,
    convs: {}, // key -> conversation (history) of that session
    runs: {}, // `${key}|${runId}` -> run as this page knows it
    order: 0,
    drafts: { ...drafts }, // key -> composer text
    policy: DEFAULT_POLICY, // limits and patterns, from hello-ok
    agents: null, // {list: [{id, name, model (its name), backend}], defaultId} from agents.list
    search: "", // sidebar search (server-side through sessions.list `search`)
    listNext: null, // {search, offset}: where the next page of the sidebar starts, or null
    notice: null,
    ...initialToolState(), // tools: toolCallId -> call; approvals: id -> approval; clockOffsetMs
    effects: [],
  };
}

const runKey = (key, runId) => `${key}|${runId}`;

function emptyConv() {
  return { loaded: false, loading: false, loadingOlder: false, hasMore: false, sessionId: null, inFlightRunId: null, messages: [] };
}

/** Duration and token usage of a finished run (`chat` terminal event or history message), or null. */
export function detailsOf(source) {
  if (!source) return null;
  const details = {};
  if (Number.isFinite(source.durationMs)) details.durationMs = source.durationMs;
  const usage = source.usage;
  if (usage && typeof usage === "object") {
    if (Number.isFinite(usage.promptTokens)) details.promptTokens = usage.promptTokens;
    if (Number.isFinite(usage.completionTokens)) details.completionTokens = usage.completionTokens;
  }
  return Object.keys(details).length ? details : null;
}

/** One line for a run's details: "1.2 s · 12 in / 30 out tokens"; "" when nothing is known. */
export function formatDetails(details) {
  if (!details) return "";
  const parts = [];
  if (details.durationMs != null) {
    const ms = details.durationMs;
    parts.push(ms < 1000 ? `${ms} ms` : ms < 60000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`);
  }
  const tokens = [];
  if (details.promptTokens != null) tokens.push(`${details.promptTokens} in`);
  if (details.completionTokens != null) tokens.push(`${details.completionTokens} out`);
  if (tokens.length) parts.push(`${tokens.join(" / ")} tokens`);
  return parts.join(" · ");
}

/**
 * The notice for `what` (a method such as `sessions.create`, or a page action) that failed, saying what
 * failed. `error` is what the failure left:
 * - a gateway error response's `error` ({code, message, retryAfterMs?}): its message and code;
 * - a client RequestError TIMEOUT: no answer in time (the connection may well be up);
 * - a client RequestError DISCONNECTED: not connected, the only failure that says so, and whether the
 *   request went out before the socket closed;
 * - any other exception: a fault in this page, by its name and message.
 */
export function failureText(what, error) {
  if (error && error.name === "RequestError") {
    if (error.code === "TIMEOUT") {
      const within = error.timeoutMs ? ` within ${Math.round(error.timeoutMs / 1000)} s` : "";
      return `${what} timed out: no answer from the gateway${within}. It may still take effect; check before trying again.`;
    }
    if (error.code === "DISCONNECTED") {
      return error.sent
        ? `Not connected: the connection closed before ${what} was answered. Check whether it took effect once the connection is back.`
        : `Not connected: ${what} was not sent. Try again when the connection is back.`;
    }
  }
  if (error instanceof Error) return `${what} failed in this page: ${error.name}: ${error.message}`;
  if (error && typeof error === "object" && (error.code || error.message)) {
    const code = error.code || "ERROR";
    const retry = error.retryAfterMs ? `; try again in ${Math.ceil(error.retryAfterMs / 1000)} s` : "";
    return error.message ? `${what} failed: ${error.message} (${code}${retry})` : `${what} failed: ${code}${retry}`;
  }
  return `${what} failed: ${error == null ? "no reason given" : String(error)}`;
}

function textOf(message) {
  if (!message || !Array.isArray(message.content)) return null;
  return message.content
    .filter((part) => part && part.type === "text" && typeof part.text === "string")
    .map((part) => part.text)
    .join("");
}

/**
 * A run's reply from the transcript, by run id: `{text, aborted, first, last, toolCallIds}`. With tools a
 * reply may span several assistant messages (one per model step, TOOLS.md §13.4): their texts are
 * one reply, a paragraph apart, as its `chat` events carry it; `last` is the last of them.
 */
function repliesByRun(messages) {
  const replies = new Map();
  for (const m of messages) {
    if (!m || m.role !== "assistant" || !m.runId) continue;
    const text = textOf(m) || "";
    const toolCallIds = toolCallIdsOf(m);
    const known = replies.get(m.runId);
    if (!known) {
      replies.set(m.runId, { text, aborted: Boolean(m.aborted), last: m, first: m, toolCallIds });
      continue;
    }
    known.text = known.text && text ? `${known.text}\n\n${text}` : known.text || text;
    known.aborted = Boolean(m.aborted);
    known.last = m;
    known.toolCallIds.push(...toolCallIds);
  }
  return replies;
}

function toolCallIdsOf(message) {
  if (!message || !Array.isArray(message.content)) return [];
  return message.content.filter((b) => b && b.type === "toolCall" && typeof b.id === "string" && b.id).map((b) => b.id);
}

/** Is `row` newer than `known`? A recreated key (later createdAt) beats any older generation. */
export function isNewerRow(row, known) {
  if (!known) return true;
  if ((row.createdAt || 0) !== (known.createdAt || 0)) return (row.createdAt || 0) > (known.createdAt || 0);
  return (row.version || 0) > (known.version || 0);
}

function tombstoned(s, row) {
  const tomb = s.tombstones[row.key];
  return Boolean(tomb) && !isNewerRow(row, tomb);
}

function newRun(s, key, runId, fields) {
  s.order += 1;
  return {
    id: runId,
    key,
    sessionId: null,
    userText: null,
    phase: "started",
    text: "",
    seq: 0,
    position: null,
    error: null,
    errorKind: null,
    stopReason: null,
    rejected: false, // ended by its ack before anything ran: the failure shows on the user's message
    own: false, // sent from this page
    sentGen: null, // connection generation the send went out on
    ackTick: null, // tick at which the server is known to have the run
    settledBy: null, // what made it terminal: event | ack | row | history
    draftRestored: false,
    details: null, // {durationMs, promptTokens, completionTokens} once finished
    order: s.order,
    ...fields,
  };
}

function putRun(s, run) {
  s.runs = { ...s.runs, [runKey(run.key, run.id)]: run };
  return run;
}

function effect(s, eff) {
  if (eff.type === "history" && s.effects.some((e) => e.type === "history" && e.key === eff.key)) return;
  if ((eff.type === "list" || eff.type === "approvals") && s.effects.some((e) => e.type === eff.type)) return;
  s.effects.push(eff);
}

/** Does the loaded conversation of `key` hold a message (the user's or a reply) of run `runId`? */
function inTranscript(s, key, runId) {
  const conv = s.convs[key];
  return Boolean(conv) && conv.messages.some((m) => m && m.runId === runId);
}

// Inline commands (docs/protocol-notes.md): these four only as the whole message; the settings
// commands with an optional argument (the gateway refuses more than one).
const BARE_COMMANDS = new Set(["/stop", "/new", "/reset", "/status"]);
const SETTING_COMMANDS = new Set(["/think", "/verbose", "/model"]);

/** The inline command a message is (its name, e.g. "/think"), or null. */
export function inlineCommand(text) {
  if (typeof text !== "string") return null;
  const words = text.trim().split(/\s+/);
  if (BARE_COMMANDS.has(words[0])) return words.length === 1 ? words[0] : null;
  return SETTING_COMMANDS.has(words[0]) ? words[0] : null;
}

function restoreDraft(s, run) {
  // A send that ended in error or timeout before any reply gives the text back (never over new typing).
  // Not when the transcript already holds the run: the message was delivered, whatever the ack says.
  if (!run.own || run.draftRestored || run.text || run.userText == null) return run;
  if (inTranscript(s, run.key, run.id)) return { ...run, draftRestored: true };
  if (!s.drafts[run.key]) {
    s.drafts = { ...s.drafts, [run.key]: run.userText };
    effect(s, { type: "draft", key: run.key });
  }
  return { ...run, draftRestored: true };
}

function settle(s, run, phase, fields, by) {
  let next = { ...run, ...fields, phase, settledBy: by, position: null };
  if (phase === "error") next = restoreDraft(s, next);
  putRun(s, next);
  endRunTools(s, next.key, next.id); // no tool card spins after its run ended
  return next;
}

// --- acks ----------------------------------------------------------------------------------

function onAck(s, { key, runId, response }) {
  const run = s.runs[runKey(key, runId)];
  if (!run) return;
  const payload = (response && response.payload) || {};
  const status = payload.status;
  if (!status) {
    onSendFailed(s, { key, runId, error: response && response.error });
    return;
  }
  let r = { ...run };
  if (payload.sessionId) r.sessionId = payload.sessionId;
  const terminal = TERMINAL_PHASES.has(r.phase);
  switch (status) {
    case "started":
    case "queued":
    case "in_flight": {
      r.ackTick = s.tick;
      if (!terminal && (r.phase === "sending" || r.phase === "queued")) {
        const queued = status === "queued" || (status === "in_flight" && payload.queuePosition);
        r.phase = queued ? "queued" : "started";
        r.position = queued ? payload.queuePosition || r.position || null : null;
      }
      putRun(s, r);
      return;
    }
    case "ok": {
      if (payload.command) {
        // An inline command (/stop, /new, /reset): no run exists; reload what it changed.
        const runs = { ...s.runs };
        delete runs[runKey(key, runId)];
        s.runs = runs;
        effect(s, { type: "history", key });
        effect(s, { type: "list" });
        return;
      }
      r.ackTick = s.tick;
      if (r.settledBy === "event") {
        putRun(s, r);
        return;
      }
      const reply = typeof payload.reply === "string" ? payload.reply : r.text;
      settle(s, r, "final", { text: reply, stopReason: payload.stopReason || "stop" }, "ack");
      return;
    }
    case "timeout":
    case "error": {
      r.ackTick = s.tick;
      // A terminal ack is followed only by a history refresh: no event for this run comes (§4).
      if (key === s.currentKey) effect(s, { type: "history", key });
      if (r.settledBy === "event") {
        putRun(s, r);
        return;
      }
      const stop = payload.stopReason || null;
      if (inTranscript(s, key, r.id)) {
        // Delivered after all (a resend after a dropped socket): the transcript has the message and
        // whatever reply there was. Nothing goes back to the composer; the failure shows on the reply.
        if (status === "timeout" && stop && stop !== "timeout") {
          settle(s, r, "aborted", { stopReason: stop, rejected: false }, "ack");
          return;
        }
      }
      let message = payload.summary;
      if (!message) {
        message =
          status === "error"
            ? (response.error && response.error.message) || "The run failed."
            : stop === "timeout"
              ? "The run timed out."
              : `The run ended before it completed (${stop || "aborted"}).`;
      }
      const rejected = !r.text && r.seq === 0 && !inTranscript(s, key, r.id);
      settle(s, r, "error", { error: message, errorKind: status, stopReason: stop, rejected }, "ack");
      return;
    }
    default:
      // An unknown status is not a reason to spin: end the run and say so.
      settle(s, r, "error", { error: `Unexpected acknowledgement: ${status}`, rejected: !r.text && !inTranscript(s, key, r.id) }, "ack");
  }
}

function onSendFailed(s, { key, runId, error }) {
  const run = s.runs[runKey(key, runId)];
  if (!run || TERMINAL_PHASES.has(run.phase)) return;
  const err = error || { code: "INTERNAL", message: "request failed" };
  const queueFull = err.details && err.details.reason === "queue-full";
  if (err.retryable && !queueFull && run.phase === "sending") {
    // Rate limited or the server is going down: the same key goes out again later.
    putRun(s, { ...run, sentGen: null });
    effect(s, { type: "retry", afterMs: Math.max(250, err.retryAfterMs || 1000) });
    return;
  }
  const message = queueFull ? "The session queue is full; try again when it drains." : err.message || err.code;
  settle(s, run, "error", { error: message, errorKind: err.code, rejected: true }, "ack");
}

// --- chat events -----------------------------------------------------------------------------

function onChat(s, p) {
  if (!p || typeof p.runId !== "string" || typeof p.sessionKey !== "string") return;
  const key = p.sessionKey;
  let run = s.runs[runKey(key, p.runId)];
  if (!run) {
    // A run this page did not start (another tab, an API client): fetch its user message.
    const queued = p.state === "status" && p.phase === "queued";
    run = newRun(s, key, p.runId, { ackTick: s.tick, sessionId: p.sessionId || null, phase: queued ? "queued" : "started" });
    if (key === s.currentKey) effect(s, { type: "history", key });
  }
  if (run.settledBy === "event") return; // exactly one terminal; nothing after it
  const seq = Number(p.seq) || 0;
  if (seq && seq <= run.seq) return; // a duplicate or an old event
  // A run whose very first event is its error never reached dispatch (failed at admission):
  // its message is not in the transcript, so the failure shows on the user's message.
  const neverStarted = run.seq === 0 && seq === 1 && !run.text && !inTranscript(s, key, run.id);
  let r = { ...run, seq: seq || run.seq };
  if (p.sessionId) r.sessionId = p.sessionId;
  if (r.ackTick === null) r.ackTick = s.tick;
  const terminal = TERMINAL_PHASES.has(r.phase);
  const text = textOf(p.message);
  switch (p.state) {
    case "status":
      if (!terminal) {
        if (p.phase === "queued") r.phase = r.phase === "sending" ? "queued" : r.phase;
        else if (r.phase !== "streaming") {
          r.phase = "started";
          r.position = null;
        }
      }
      putRun(s, r);
      return;
    case "delta":
      if (terminal) return;
      r.phase = "streaming";
      r.position = null;
      r.text = text != null ? text : r.text + (p.deltaText || "");
      putRun(s, r);
      return;
    case "final":
      settle(s, r, "final", { text: text != null ? text : r.text, stopReason: p.stopReason || "stop", rejected: false, error: null, details: detailsOf(p) }, "event");
      return;
    case "error":
      settle(
        s,
        r,
        "error",
        {
          text: text != null ? text : r.text,
          error: p.errorMessage || "The run failed.",
          errorKind: p.errorKind || "unknown",
          rejected: (r.rejected || neverStarted) && !text,
          details: detailsOf(p),
        },
        "event",
      );
      return;
    case "aborted":
      settle(s, r, "aborted", { text: text != null ? text : r.text, stopReason: p.stopReason || "rpc", rejected: false, details: detailsOf(p) }, "event");
      return;
    default:
      putRun(s, r);
  }
}

// --- session rows ------------------------------------------------------------------------------

function runsOf(s, key) {
  return Object.values(s.runs).filter((r) => r.key === key);
}

function settleFromRow(s, run, row) {
  const by = "row";
  switch (row.status) {
    case "done":
      settle(s, run, "final", { stopReason: "stop" }, by);
      if (row.key === s.currentKey) effect(s, { type: "history", key: row.key }); // fetch the reply text
      return;
    case "failed":
    case "timeout":
      settle(s, run, "error", { error: row.lastRunError || `The run ended: ${row.status}.`, errorKind: row.status }, by);
      return;
    default:
      settle(s, run, "aborted", { stopReason: row.abortedLastRun ? "rpc" : null }, by);
  }
}

/** Bring this page's runs in line with a (newer) committed row of their session. */
function reconcileRuns(s, row) {
  const active = row.activeRunIds || [];
  const queued = row.queuedRunIds || [];
  let check = false;
  for (const run of runsOf(s, row.key)) {
    if (run.sessionId && row.sessionId && run.sessionId !== row.sessionId) continue;
    if (TERMINAL_PHASES.has(run.phase)) continue;
    if (active.includes(run.id)) {
      if (run.phase === "sending" || run.phase === "queued") {
        putRun(s, { ...run, phase: "started", position: null, ackTick: run.ackTick ?? s.tick });
      }
    } else if (queued.includes(run.id)) {
      const position = queued.indexOf(run.id) + 1;
      if (run.phase === "sending" || run.phase === "queued") {
        putRun(s, { ...run, phase: "queued", position, ackTick: run.ackTick ?? s.tick });
      }
    } else if (run.phase !== "sending") {
      // lastRunId is set when a run becomes active: if it names this run and nothing is active, it ended.
      if (row.lastRunId === run.id && !row.hasActiveRun) settleFromRow(s, run, row);
      else check = true; // maybe ended, maybe the row is older than the run: ask history
    }
  }
  const known = (id) => Boolean(s.runs[runKey(row.key, id)]);
  if ([...active, ...queued].some((id) => !known(id))) check = true;
  if (check && row.key === s.currentKey) effect(s, { type: "history", key: row.key });
}

function acceptRow(s, row) {
  if (!row || typeof row.key !== "string") return false;
  if (row.deleted) {
    removeSession(s, row.key, row);
    return true;
  }
  if (tombstoned(s, row) || !isNewerRow(row, s.rows[row.key])) return false;
  const previous = s.rows[row.key];
  s.rows = { ...s.rows, [row.key]: { ...row, _seen: s.tick } };
  const conv = s.convs[row.key];
  if (previous && conv && conv.loaded && conv.sessionId && row.sessionId && row.sessionId !== conv.sessionId) {
    // Reset elsewhere: the transcript generation changed.
    if (row.key === s.currentKey) effect(s, { type: "history", key: row.key });
  }
  reconcileRuns(s, row);
  return true;
}

function removeSession(s, key, row) {
  const known = s.rows[key];
  // A delete of an older generation of this key does not remove a newer session.
  if (row && known && (known.createdAt || 0) > (row.createdAt || 0)) return;
  const tomb = row || known;
  if (tomb) s.tombstones = { ...s.tombstones, [key]: { createdAt: tomb.createdAt || 0, version: tomb.version || 0 } };
  const rows = { ...s.rows };
  delete rows[key];
  s.rows = rows;
  const convs = { ...s.convs };
  delete convs[key];
  s.convs = convs;
  const runs = {};
  for (const [k, r] of Object.entries(s.runs)) if (r.key !== key) runs[k] = r;
  s.runs = runs;
  const tools = {};
  for (const [id, call] of Object.entries(s.tools)) if (call.key !== key) tools[id] = call;
  s.tools = tools;
  const approvals = {};
  for (const [id, a] of Object.entries(s.approvals)) if (a.key !== key) approvals[id] = a;
  s.approvals = approvals;
  if (s.currentKey === key) {
    const next = sortedRows(s)[0];
    s.currentKey = next ? next.key : s.mainKey;
    effect(s, { type: "history", key: s.currentKey });
    effect(s, { type: "draft", key: s.currentKey });
  }
}

function sortedRows(s) {
  return Object.values(s.rows).sort(
    (a, b) => (b.updatedAt || 0) - (a.updatedAt || 0) || String(a.key).localeCompare(String(b.key)),
  );
}

// --- history ---------------------------------------------------------------------------------------

/**
 * `messages` whose place is before message id `limit`. A `toolResult` item's id is its call's id (not a
 * number): it sits with the assistant message before it, so it goes wherever that message goes.
 */
function messagesBefore(messages, limit) {
  let anchor = -Infinity;
  return messages.filter((m) => {
    const id = Number(m.id);
    if (Number.isFinite(id)) anchor = id;
    return anchor < limit;
  });
}

/** The first numeric message id of `messages` (Infinity when there is none). */
function firstMessageId(messages) {
  for (const m of messages) {
    const id = Number(m.id);
    if (Number.isFinite(id)) return id;
  }
  return Infinity;
}

function onHistory(s, { key, token, payload, older }) {
  const conv = s.convs[key] || emptyConv();
  const messages = Array.isArray(payload.messages) ? payload.messages : [];
  if (older) {
    const firstId = firstMessageId(conv.messages);
    if (payload.sessionId && conv.sessionId && payload.sessionId !== conv.sessionId) {
      s.convs = { ...s.convs, [key]: { ...conv, loadingOlder: false } };
      return;
    }
    const prepend = messagesBefore(messages, firstId);
    s.convs = {
      ...s.convs,
      [key]: { ...conv, loadingOlder: false, hasMore: Boolean(payload.hasMore), messages: [...prepend, ...conv.messages] },
    };
    ingestHistory(s, key, messages, { sessionId: conv.sessionId });
    return;
  }
  const sameGen = conv.sessionId && conv.sessionId === payload.sessionId;
  let kept = [];
  if (sameGen && messages.length) {
    // Keep older pages the user scrolled back to.
    const firstNew = firstMessageId(messages);
    kept = messagesBefore(conv.messages, firstNew);
  }
  s.convs = {
    ...s.convs,
    [key]: {
      ...conv,
      loaded: true,
      loading: false,
      sessionId: payload.sessionId || null,
      hasMore: kept.length ? conv.hasMore : Boolean(payload.hasMore),
      messages: [...kept, ...messages],
    },
  };
  if (payload.session) acceptRow(s, payload.session);

  const gen = payload.sessionId || null;
  const inFlight = payload.inFlightRun && typeof payload.inFlightRun.runId === "string" ? payload.inFlightRun : null;
  const queuedRuns = Array.isArray(payload.queuedRuns) ? payload.queuedRuns : [];
  s.convs = { ...s.convs, [key]: { ...s.convs[key], inFlightRunId: inFlight ? inFlight.runId : null } };
  if (inFlight) {
    let run = s.runs[runKey(key, inFlight.runId)] || newRun(s, key, inFlight.runId, {});
    if (run.settledBy !== "event") {
      const seq = Number(inFlight.seq) || 0;
      const r = { ...run, sessionId: gen || run.sessionId, ackTick: run.ackTick ?? s.tick };
      if (seq >= run.seq || TERMINAL_PHASES.has(run.phase)) {
        r.seq = Math.max(seq, run.seq);
        if (typeof inFlight.text === "string" && inFlight.text.length >= (run.text || "").length) r.text = inFlight.text;
        r.phase = r.text ? "streaming" : "started";
        r.position = null;
        r.settledBy = null;
      }
      putRun(s, r);
    }
  }
  const queuedIds = new Set();
  for (const q of [...queuedRuns].sort((a, b) => (a.position || 0) - (b.position || 0))) {
    if (!q || typeof q.runId !== "string") continue;
    queuedIds.add(q.runId);
    const run = s.runs[runKey(key, q.runId)] || newRun(s, key, q.runId, { phase: "queued" });
    if (TERMINAL_PHASES.has(run.phase) && run.settledBy === "event") continue;
    if (ACTIVE_PHASES.has(run.phase) && run.seq > 0) continue; // events already showed it running
    putRun(s, {
      ...run,
      phase: "queued",
      position: q.position || null,
      userText: run.userText ?? (typeof q.text === "string" ? q.text : null),
      sessionId: gen || run.sessionId,
      ackTick: run.ackTick ?? s.tick,
      settledBy: null,
    });
  }
  // Tool calls and results in the transcript, and those of the run in flight (TOOLS.md §13.4).
  ingestHistory(s, key, messages, { sessionId: gen, inFlight });
  // Runs the server no longer has open ended while we were not looking: settle them from history.
  const row = s.rows[key];
  const assistantByRun = repliesByRun(s.convs[key].messages);
  for (const run of runsOf(s, key)) {
    if (TERMINAL_PHASES.has(run.phase) || run.phase === "sending") continue;
    if (run.ackTick === null || run.ackTick > token) continue; // the server may not have had it yet
    if (inFlight && inFlight.runId === run.id) continue;
    if (queuedIds.has(run.id)) continue;
    if (run.sessionId && gen && run.sessionId !== gen) {
      settle(s, run, "aborted", { stopReason: "reset" }, "history");
      continue;
    }
    const reply = assistantByRun.get(run.id);
    const rowSaysFailed = row && row.lastRunId === run.id && (row.status === "failed" || row.status === "timeout");
    if (reply && !reply.aborted) settle(s, run, "final", { text: reply.text }, "history");
    else if (rowSaysFailed) settle(s, run, "error", { text: reply ? reply.text : run.text, error: row.lastRunError || `The run ended: ${row.status}.` }, "history");
    else settle(s, run, "aborted", { text: reply ? reply.text : run.text, stopReason: row && row.lastRunId === run.id && row.abortedLastRun ? "rpc" : null }, "history");
  }
}

// --- the reducer ---------------------------------------------------------------------------------

/** Apply one action; returns the next state (the input is not changed). */
export function reduce(state, action) {
  const s = { ...state, tick: state.tick + 1, effects: [] };
  switch (action.type) {
    case "conn/connecting":
      s.conn = { ...s.conn, status: "connecting", retryInMs: null };
      return s;
    case "conn/open":
      s.conn = { ...s.conn, lastSeq: 0 };
      return s;
    case "conn/ready": {
      const hello = action.hello || {};
      const defaults = (hello.snapshot && hello.snapshot.sessionDefaults) || {};
      s.conn = {
        ...s.conn,
        status: "online",
        gen: s.conn.gen + 1,
        retryInMs: null,
        error: null,
        user: (hello.auth && hello.auth.user) || s.conn.user,
      };
      if (defaults.mainSessionKey) s.mainKey = defaults.mainSessionKey;
      s.policy = policyFrom(hello);
      if (s.notice && s.notice.kind === "conn") s.notice = null;
      // Resync (§9): rows, then the open conversation, then pending approvals (§13.5); unsent
      // messages go out after that.
      effect(s, { type: "list" });
      effect(s, { type: "history", key: s.currentKey });
      effect(s, { type: "approvals" });
      effect(s, { type: "flush" });
      return s;
    }
    case "conn/closed":
      s.conn = { ...s.conn, status: "offline", retryInMs: action.retryInMs ?? null, error: action.error || null };
      return s;
    case "event": {
      const frame = action.frame || {};
      if (typeof frame.seq === "number") {
        if (isSeqGap(s.conn.lastSeq, frame.seq)) {
          effect(s, { type: "list" });
          effect(s, { type: "history", key: s.currentKey });
          effect(s, { type: "approvals" });
        }
        s.conn = { ...s.conn, lastSeq: frame.seq };
      }
      const payload = frame.payload;
      if (frame.event === "chat") onChat(s, payload);
      else if (frame.event === "sessions.changed") acceptRow(s, payload && payload.session);
      else if (frame.event === "agent") onAgentEvent(s, payload, { effect: (eff) => effect(s, eff) });
      else if (frame.event === "plugin.approval.requested") onApprovalRequested(s, payload, action.at);
      else if (frame.event === "plugin.approval.resolved") onApprovalResolved(s, payload);
      else if ((frame.event === "tick" || frame.event === "connect.challenge") && payload) onServerTime(s, payload.ts, action.at);
      else if (frame.event === "shutdown") {
        s.notice = { text: "The server is restarting; this page reconnects by itself.", tick: s.tick, kind: "conn" };
      }
      return s;
    }
    case "session/select": {
      const key = canonicalKey(action.key, "main", s.policy) || s.mainKey;
      s.currentKey = key;
      effect(s, { type: "history", key });
      effect(s, { type: "draft", key });
      return s;
    }
    case "session/row":
      acceptRow(s, action.row);
      return s;
    case "session/deleted":
      removeSession(s, action.key, null);
      return s;
    case "list/loaded": {
      const payload = action.payload || {};
      const incoming = Array.isArray(payload.sessions) ? payload.sessions : [];
      const listed = new Set(incoming.map((r) => r.key));
      const search = action.search || "";
      if (search === s.search) {
        const next = payload.hasMore && payload.nextOffset != null ? payload.nextOffset : null;
        s.listNext = next == null ? null : { search, offset: next };
      }
      if (!search && !payload.hasMore && !(payload.offset > 0 || action.offset > 0)) {
        const rows = {};
        for (const [key, row] of Object.entries(s.rows)) {
          if (listed.has(key) || row._seen > action.token) rows[key] = row; // arrived after the request
        }
        s.rows = rows;
      }
      for (const row of incoming) acceptRow(s, row);
      s.listLoaded = true;
      return s;
    }
    case "history/request": {
      const conv = s.convs[action.key] || emptyConv();
      s.convs = { ...s.convs, [action.key]: action.older ? { ...conv, loadingOlder: true } : { ...conv, loading: true } };
      return s;
    }
    case "history/loaded":
      onHistory(s, action);
      return s;
    case "history/failed": {
      const conv = s.convs[action.key];
      if (conv) s.convs = { ...s.convs, [action.key]: { ...conv, loading: false, loadingOlder: false } };
      if (action.error && action.error.code !== "DISCONNECTED") {
        s.notice = { text: `Could not load the conversation: ${action.error.message || action.error.code}`, tick: s.tick };
      }
      return s;
    }
    case "search/set":
      s.search = String(action.text || "").trim();
      s.listNext = null;
      effect(s, { type: "list" });
      return s;
    case "agents/loaded": {
      const payload = action.payload || {};
      const list = (Array.isArray(payload.agents) ? payload.agents : [])
        .filter((a) => a && typeof a.id === "string")
        // the model comes as OpenClaw's {primary}; the page shows its name
        .map((a) => ({ ...a, model: typeof a.model === "string" ? a.model : (a.model && a.model.primary) || "" }));
      s.agents = { list, defaultId: payload.defaultId || "main" };
      return s;
    }
    case "draft/set":
      s.drafts = { ...s.drafts, [action.key]: action.text };
      return s;
    case "send/request": {
      const key = canonicalKey(action.key, "main", s.policy) || s.currentKey;
      if (s.runs[runKey(key, action.runId)]) return s;
      putRun(s, newRun(s, key, action.runId, { phase: "sending", userText: action.text, own: true }));
      if (!action.restored && !action.keepDraft) {
        s.drafts = { ...s.drafts, [key]: "" };
        effect(s, { type: "draft", key });
      }
      effect(s, { type: "flush" });
      return s;
    }
    case "send/sent": {
      const run = s.runs[runKey(action.key, action.runId)];
      if (run) putRun(s, { ...run, sentGen: action.gen });
      return s;
    }
    case "send/ack":
      onAck(s, action);
      return s;
    case "send/failed":
      onSendFailed(s, action);
      return s;
    case "send/unsent": {
      // The request never got an answer (the socket closed): it goes out again on the next connection.
      const run = s.runs[runKey(action.key, action.runId)];
      if (!run || run.phase !== "sending") return s;
      const command = inlineCommand(run.userText);
      if (command && run.sentGen !== null) {
        // Commands are not deduplicated by key: a resent /stop could stop a run started since.
        // It may or may not have been carried out, so it is not sent again; the page says so.
        settle(
          s,
          { ...run, draftRestored: true },
          "error",
          {
            error: `The connection dropped before ${command} was confirmed, so it was not sent again. Check the conversation; send it again if it is still needed.`,
            errorKind: "unconfirmed",
            rejected: true,
          },
          "ack",
        );
        return s;
      }
      putRun(s, { ...run, sentGen: null });
      return s;
    }
    case "notice":
      s.notice = action.text ? { text: action.text, tick: s.tick } : null;
      return s;
    case "approvals/listed":
      // plugin.approval.list answered (asked at tick `token`): it replaces the pending approvals.
      onApprovalsListed(s, action);
      return s;
    case "approval/sending":
      onApprovalSending(s, action);
      return s;
    case "approval/answered": {
      // plugin.approval.resolve answered (`response`) or not (`error`, a RequestError).
      const what = action.decision === "deny" ? "Deny" : "Allow once";
      const response = action.response || null;
      const error = response ? response.error : action.error;
      onApprovalAnswered(s, { id: action.id, response, errorText: response && response.ok ? null : failureText(what, error) });
      return s;
    }
    case "stop/answered": {
      // The chat.abort answers for `key`: a refusal is shown; when none stopped anything, the
      // run had ended already (its terminal may be missing here), so the conversation is reloaded.
      const results = action.results || [];
      const failed = results.find((r) => !r.ok);
      if (failed) s.notice = { text: failureText("Stop", failed.error), tick: s.tick };
      else if (results.every((r) => !(r.payload && r.payload.aborted))) effect(s, { type: "history", key: action.key });
      return s;
    }
    default:
      return s;
  }
}

// --- selectors -------------------------------------------------------------------------------------

/** chat.send requests that should go out now: unsent, or sent on a connection that is gone. */
export function outbox(state) {
  if (state.conn.status !== "online") return [];
  return Object.values(state.runs)
    .filter((r) => r.phase === "sending" && r.sentGen !== state.conn.gen)
    .sort((a, b) => a.order - b.order);
}

function liveRuns(state, key) {
  const conv = state.convs[key];
  const gen = conv && conv.sessionId;
  return Object.values(state.runs)
    .filter((r) => r.key === key && (!gen || !r.sessionId || r.sessionId === gen))
    .sort((a, b) => a.order - b.order);
}

/** What the composer needs: is a run of this session active (Stop), is a send pending, how many queued. */
export function activity(state, key) {
  const runs = liveRuns(state, key);
  const row = state.rows[key];
  const activeIds = new Set(runs.filter((r) => ACTIVE_PHASES.has(r.phase)).map((r) => r.id));
  if (row && row.hasActiveRun) {
    for (const id of row.activeRunIds || []) {
      const run = state.runs[runKey(key, id)];
      // A row can lag behind a terminal this page already saw: the terminal wins.
      if (!run || !TERMINAL_PHASES.has(run.phase)) activeIds.add(id);
    }
  }
  const queuedLocal = runs.filter((r) => r.phase === "queued").length;
  const queuedRow = row
    ? (row.queuedRunIds || []).filter((id) => {
        const run = state.runs[runKey(key, id)];
        return !run || !TERMINAL_PHASES.has(run.phase);
      }).length
    : 0;
  return {
    active: activeIds.size > 0,
    activeRunIds: [...activeIds],
    pending: runs.some((r) => r.phase === "sending"),
    queued: Math.max(queuedLocal, queuedRow),
  };
}

/**
 * The sidebar: rows newest first. The open session and the default (main) session are listed
 * even before they exist on the server, so there is always a way back to them.
 */
export function sessionList(state) {
  const needle = (state.search || "").toLowerCase();
  const matches = (key, label) => !needle || key.toLowerCase().includes(needle) || (label || "").toLowerCase().includes(needle);
  const rows = sortedRows(state).filter((row) => matches(row.key, row.label));
  const items = rows.map((row) => ({
    key: row.key,
    label: row.label || shortName(row.key),
    status: row.hasActiveRun ? "running" : row.status || "new",
    queued: (row.queuedRunIds || []).length,
    error: row.lastRunError || null,
    current: row.key === state.currentKey,
    updatedAt: row.updatedAt || null,
    needsApproval: needsApproval(state, row.key), // "needs approval" instead of the running spinner
  }));
  const placeholders = [...new Set([state.currentKey, state.mainKey])].filter(
    (key) => key && !state.rows[key] && matches(key, shortName(key)),
  );
  items.unshift(
    ...placeholders.map((key) => ({
      key,
      label: shortName(key),
      status: "new",
      queued: 0,
      error: null,
      current: key === state.currentKey,
      updatedAt: null,
      needsApproval: needsApproval(state, key),
    })),
  );
  return items;
}

function assistantFromRun(run, inTranscript = false) {
  const base = { id: `a:${run.id}`, role: "assistant", runId: run.id, text: run.text || "", details: run.details || null };
  switch (run.phase) {
    case "started":
    case "streaming":
      return { ...base, state: "streaming" };
    case "final":
      return { ...base, state: "final" };
    case "aborted":
      return { ...base, state: "aborted", meta: stopLabel(run.stopReason) };
    case "error":
      if (run.rejected && !inTranscript) return null; // shown on the user's message instead
      return { ...base, state: "error", error: run.error || "The run failed.", errorKind: run.errorKind || null };
    default:
      return null;
  }
}

export function stopLabel(reason) {
  switch (reason) {
    case "rpc":
    case "stop":
      return "Stopped";
    case "interrupt":
    case "steer":
      return "Interrupted by a newer message";
    case "reset":
      return "Stopped: session reset";
    case "delete":
      return "Stopped: session deleted";
    case "operator":
      return "Stopped by an operator";
    default:
      return "Stopped";
  }
}

function userFromRun(run) {
  if (run.userText == null) return null;
  const base = { id: `u:${run.id}`, role: "user", runId: run.id, text: run.userText };
  if (run.phase === "sending") return { ...base, state: "sending" };
  if (run.phase === "queued") return { ...base, state: "queued", position: run.position };
  if (run.phase === "error" && run.rejected) {
    return { ...base, state: "error", error: run.error, errorKind: run.errorKind || null, unconfirmed: run.errorKind === "unconfirmed" };
  }
  return { ...base, state: "final" };
}

/**
 * The tool cards of session `key`, by run: items `{id: "t:<toolCallId>", role: "tool", runId,
 * toolCallId, state, view}` in call order (`view`: tools.js `toolCardView`). A call belongs to the
 * conversation of its session, and of its generation when both are known.
 */
function toolCardsByRun(state, key, gen) {
  const byRun = new Map();
  const calls = Object.values(state.tools)
    .filter((c) => c.key === key && (!gen || !c.sessionId || c.sessionId === gen))
    .sort((a, b) => a.order - b.order);
  for (const call of calls) {
    const view = toolCardView(call, approvalOf(state, call));
    const item = { id: `t:${call.id}`, role: "tool", runId: call.runId, toolCallId: call.id, state: view.state, view };
    const list = byRun.get(call.runId) || [];
    list.push(item);
    byRun.set(call.runId, list);
  }
  return byRun;
}

/**
 * The conversation as a list of items: history first, then what is live on this page. A run's tool
 * cards come right before its reply, in call order (the transcript's order of `toolCall` blocks
 * first); `toolResult` messages are not items of their own, their outcome is on the card.
 */
export function conversation(state, key) {
  const conv = state.convs[key] || emptyConv();
  const row = state.rows[key];
  const items = [];
  const userRuns = new Set();
  const replies = repliesByRun(conv.messages);
  for (const m of conv.messages) if (m.runId && m.role === "user") userRuns.add(m.runId);
  const cards = toolCardsByRun(state, key, conv.sessionId);
  const placed = new Set();
  const pushCards = (runId, firstIds = []) => {
    const list = cards.get(runId) || [];
    const byId = new Map(list.map((item) => [item.toolCallId, item]));
    for (const id of [...firstIds, ...list.map((item) => item.toolCallId)]) {
      const item = byId.get(id);
      if (!item || placed.has(item.id)) continue;
      placed.add(item.id);
      items.push(item);
    }
  };
  for (const m of conv.messages) {
    if (m.role === "toolResult") continue;
    const run = m.runId ? state.runs[runKey(key, m.runId)] : null;
    if (m.role === "user") {
      items.push({ id: m.runId ? `u:${m.runId}` : `m:${m.id}`, role: "user", runId: m.runId || null, text: textOf(m) || "", state: "final" });
      if (m.runId && !replies.has(m.runId)) {
        pushCards(m.runId);
        const live = run ? assistantFromRun(run, true) : null;
        if (live) items.push(live);
        else if (!run && row && row.lastRunId === m.runId && !row.hasActiveRun && (row.status === "failed" || row.status === "timeout")) {
          items.push({ id: `a:${m.runId}`, role: "assistant", runId: m.runId, text: "", state: "error", error: row.lastRunError || `The run ended: ${row.status}.`, errorKind: row.status });
        }
      }
    } else if (m.role === "assistant" && m.runId) {
      const reply = replies.get(m.runId);
      if (reply.first !== m) continue; // one reply per run, at its first message
      pushCards(m.runId, reply.toolCallIds);
      if (run && ACTIVE_PHASES.has(run.phase) && conv.inFlightRunId === m.runId) {
        // Still running (history holds its steps so far): the live reply, which carries the whole text.
        items.push(assistantFromRun(run, true));
        continue;
      }
      const last = reply.last;
      const item = {
        id: `a:${m.runId}`,
        role: "assistant",
        runId: m.runId,
        text: reply.text,
        state: reply.aborted ? "aborted" : "final",
        details: detailsOf(last) || (run && run.details) || null,
      };
      if (run && run.phase === "error" && !run.rejected) {
        item.state = "error";
        item.error = run.error;
        item.errorKind = run.errorKind || null;
      } else if (reply.aborted) {
        item.meta = run && run.phase === "aborted" ? stopLabel(run.stopReason) : "Stopped";
      }
      items.push(item);
    } else {
      if (m.role === "assistant") {
        for (const id of toolCallIdsOf(m)) {
          const call = state.tools[id];
          if (!call || placed.has(`t:${id}`)) continue;
          const view = toolCardView(call, approvalOf(state, call));
          placed.add(`t:${id}`);
          items.push({ id: `t:${id}`, role: "tool", runId: call.runId, toolCallId: id, state: view.state, view });
        }
      }
      items.push({ id: `m:${m.id}`, role: m.role, runId: m.runId || null, text: textOf(m) || "", state: m.aborted ? "aborted" : "final", details: detailsOf(m) });
    }
  }
  for (const run of liveRuns(state, key)) {
    if (userRuns.has(run.id) || replies.has(run.id)) continue;
    const user = userFromRun(run);
    if (user) items.push(user);
    pushCards(run.id);
    const reply = assistantFromRun(run);
    if (reply) items.push(reply);
  }
  // Calls of runs not placed above (their run is not loaded yet): at the end while they are open, or
  // when their run is known to this page; an ended call of a run on an older page waits for that page.
  for (const list of cards.values()) {
    for (const item of list) {
      if (placed.has(item.id)) continue;
      const call = state.tools[item.toolCallId];
      const open = !TOOL_TERMINAL.has(call.status) && !call.runEnded;
      if (!open && !state.runs[runKey(key, call.runId)]) continue;
      placed.add(item.id);
      items.push(item);
    }
  }
  return items;
}

// --- message actions -------------------------------------------------------------------------------

/** The user's text of run `runId` in this conversation (history or this page), or null. */
function userTextOf(state, key, items, runId) {
  if (!runId) return null;
  const item = items.find((i) => i.role === "user" && i.runId === runId);
  if (item) return item.text;
  const run = state.runs[runKey(key, runId)];
  return run && run.userText != null ? run.userText : null;
}

/**
 * What Retry would send again for session `key`: the last reply's user text, when that reply
 * (or a send refused by its ack) is the last item and has ended. `enabled` is false while a run
 * of the session is active, queued or being sent: a retry goes through chat.send like any
 * message, and never beside a running reply. Null when there is nothing to retry.
 */
export function retryTarget(state, key, items = conversation(state, key)) {
  const last = items[items.length - 1];
  if (!last || !last.runId) return null;
  const retryable =
    (last.role === "assistant" && (last.state === "final" || last.state === "error" || last.state === "aborted")) ||
    (last.role === "user" && last.state === "error" && !last.unconfirmed);
  if (!retryable) return null;
  const text = userTextOf(state, key, items, last.runId);
  if (text == null || !text.trim() || inlineCommand(text)) return null;
  const act = activity(state, key);
  return { itemId: last.id, runId: last.runId, text, enabled: !act.active && !act.pending && act.queued === 0 };
}

/** The last user message of session `key` that Edit may put back in the composer, or null. */
export function editTarget(state, key, items = conversation(state, key)) {
  for (let i = items.length - 1; i >= 0; i -= 1) {
    const item = items[i];
    if (item.role !== "user") continue;
    if (item.state === "sending" || item.state === "queued") return null;
    return { itemId: item.id, runId: item.runId, text: item.text };
  }
  return null;
}

// --- offline outbox ----------------------------------------------------------------------------------

/**
 * The sends that must survive a reload: this page's runs that no ack has answered yet, in
 * send order. The page stores them; on load it puts them back with `send/request` (same
 * idempotency key, `restored: true`), so each goes out once when the socket is back.
 */
export function storedOutbox(state) {
  return Object.values(state.runs)
    .filter((r) => r.own && r.phase === "sending" && r.userText != null)
    .sort((a, b) => a.order - b.order)
    .map((r) => ({ key: r.key, runId: r.id, text: r.userText }));
}

/** The drafts worth keeping across a reload (non-empty ones). */
export function storedDrafts(state) {
  const out = {};
  for (const [key, text] of Object.entries(state.drafts)) if (typeof text === "string" && text.trim()) out[key] = text;
  return out;
}
