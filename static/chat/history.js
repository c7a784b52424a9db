// The open conversation's history (`chat.history`): pages of the transcript, the run in flight and
// the queued runs it reports, and the runs it shows have ended while the page was not looking
// (PROTOCOL.md §9). Pure.

import { ACTIVE_PHASES, TERMINAL_PHASES, emptyConv, runKey } from "./model.js";
import { newRun, putRun, runsOf, settle } from "./runs.js";
import { acceptRow } from "./sessions.js";
import { ingestHistory } from "./tools.js";
import { repliesByRun } from "./transcript.js";

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

/** An older page (`beforeId`): put before what is loaded, unless the session was reset meanwhile. */
function onOlderPage(s, key, conv, payload, messages) {
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
}

/** The latest page replaces the transcript, keeping older pages of the same generation. */
function takeLatestPage(s, key, conv, payload, messages) {
  // (after a branch change the older pages are of another branch: not kept)
  const sameGen = conv.sessionId && conv.sessionId === payload.sessionId && !conv.replaceAll;
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
      replaceAll: false,
      sessionId: payload.sessionId || null,
      hasMore: kept.length ? conv.hasMore : Boolean(payload.hasMore),
      messages: [...kept, ...messages],
    },
  };
}

/** The run in flight (`inFlightRun`): running, with its text so far, unless its events were newer. */
function resumeInFlight(s, key, inFlight, gen) {
  const run = s.runs[runKey(key, inFlight.runId)] || newRun(s, key, inFlight.runId, {});
  if (run.settledBy === "event") return;
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

/** The queued runs (`queuedRuns`, not in the spec) as queued messages; returns their ids. */
function resumeQueued(s, key, queuedRuns, gen) {
  const queuedIds = new Set();
  for (const q of [...queuedRuns].sort((a, b) => (a.position || 0) - (b.position || 0))) {
    if (!q || typeof q.runId !== "string") continue;
    queuedIds.add(q.runId);
    const run = s.runs[runKey(key, q.runId)] || newRun(s, key, q.runId, { phase: "queued" });
    if (TERMINAL_PHASES.has(run.phase) && run.settledBy === "event") continue;
    if (ACTIVE_PHASES.has(run.phase) && run.seq > 0) continue; // events already showed it running
    putRun(s, {
      ...run,
      phase: run.phase === "steering" ? "steering" : "queued", // a steer waiting for its run stays one
      position: q.position || null,
      userText: run.userText ?? (typeof q.text === "string" ? q.text : null),
      sessionId: gen || run.sessionId,
      ackTick: run.ackTick ?? s.tick,
      settledBy: null,
    });
  }
  return queuedIds;
}

/** Runs the server no longer has open ended while we were not looking: settle them from history. */
function settleEnded(s, key, { token, gen, inFlight, queuedIds }) {
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

/** A `chat.history` answer for `key`, asked at tick `token` (`older`: a page before what is loaded). */
function onHistory(s, { key, token, payload, older }) {
  const conv = s.convs[key] || emptyConv();
  const messages = Array.isArray(payload.messages) ? payload.messages : [];
  if (older) {
    onOlderPage(s, key, conv, payload, messages);
    return;
  }
  takeLatestPage(s, key, conv, payload, messages);
  if (payload.session) acceptRow(s, payload.session);

  const gen = payload.sessionId || null;
  const inFlight = payload.inFlightRun && typeof payload.inFlightRun.runId === "string" ? payload.inFlightRun : null;
  const queuedRuns = Array.isArray(payload.queuedRuns) ? payload.queuedRuns : [];
  s.convs = { ...s.convs, [key]: { ...s.convs[key], inFlightRunId: inFlight ? inFlight.runId : null } };
  if (inFlight) resumeInFlight(s, key, inFlight, gen);
  const queuedIds = resumeQueued(s, key, queuedRuns, gen);
  // Tool calls and results in the transcript, and those of the run in flight (TOOLS.md §13.4).
  ingestHistory(s, key, messages, { sessionId: gen, inFlight });
  settleEnded(s, key, { token, gen, inFlight, queuedIds });
}

/** The reducer's actions of history (state.js puts them in its table). */
export const historyHandlers = {
  "history/request": (s, action) => {
    const conv = s.convs[action.key] || emptyConv();
    s.convs = { ...s.convs, [action.key]: action.older ? { ...conv, loadingOlder: true } : { ...conv, loading: true } };
  },
  "history/loaded": onHistory,
  "history/failed": (s, action) => {
    const conv = s.convs[action.key];
    if (conv) s.convs = { ...s.convs, [action.key]: { ...conv, loading: false, loadingOlder: false } };
    if (action.error && action.error.code !== "DISCONNECTED") {
      s.notice = { text: `Could not load the conversation: ${action.error.message || action.error.code}`, tick: s.tick };
    }
  },
};
