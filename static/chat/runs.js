// A run as this page knows it (`state.runs`): its record, how it ends (`settle`), its `chat` events
// (PROTOCOL.md §4), and what the composer needs to know of a session's runs. Pure.

import { ACTIVE_PHASES, TERMINAL_PHASES, effect, inTranscript, runKey } from "./model.js";
import { steerStatus } from "./steering.js";
import { endRunTools } from "./tools.js";
import { detailsOf, textOf } from "./transcript.js";

/** A new run record of session `key` (its place in send order is taken now); `fields` override the defaults. */
export function newRun(s, key, runId, fields) {
  s.order += 1;
  return {
    id: runId,
    key,
    sessionId: null,
    userText: null,
    attachments: [], // the files a send of this page names: {fileId, fileName, mimeType, size}
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
    queueMode: null, // "steer": sent into the session's working run
    steeredInto: null, // the run a steer was acked into (steering.js)
    details: null, // {durationMs, promptTokens, completionTokens} once finished
    order: s.order,
    ...fields,
  };
}

/** Store `run` (a new object) in the draft state. */
export function putRun(s, run) {
  s.runs = { ...s.runs, [runKey(run.key, run.id)]: run };
  return run;
}

/** The runs of session `key`, any generation. */
export function runsOf(s, key) {
  return Object.values(s.runs).filter((r) => r.key === key);
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

/** End `run` in `phase` (a terminal phase) with `fields`; `by` says what ended it: event | ack | row | history. */
export function settle(s, run, phase, fields, by) {
  let next = { ...run, ...fields, phase, settledBy: by, position: null };
  if (phase === "error") next = restoreDraft(s, next);
  putRun(s, next);
  endRunTools(s, next.key, next.id); // no tool card spins after its run ended
  // a regenerated or edited branch's run: history then has its reply with its siblings (branches.js)
  if (next.reloadOnEnd && next.key === s.currentKey) effect(s, { type: "history", key: next.key });
  return next;
}

// --- chat events -----------------------------------------------------------------------------

/** A `chat` event: the run's status, its reply so far, or its one terminal (later events change nothing). */
export function onChat(s, p) {
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
      if (!terminal && steerStatus(r, p)) {
        putRun(s, r);
        return;
      }
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
      // A steer taken by its run: the transcript now holds the reply so far, then the steer.
      if (p.stopReason === "steered" && key === s.currentKey) effect(s, { type: "history", key });
      settle(s, r, "aborted", { text: text != null ? text : r.text, stopReason: p.stopReason || "rpc", rejected: false, details: detailsOf(p) }, "event");
      return;
    default:
      putRun(s, r);
  }
}

// --- selectors -------------------------------------------------------------------------------------

/** The runs of session `key` of its loaded generation (and those of no known generation), in send order. */
export function liveRuns(state, key) {
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
        // a steer waiting for its run is in the server's queue, but it is not queued behind the reply
        return !run || (!TERMINAL_PHASES.has(run.phase) && run.phase !== "steering");
      }).length
    : 0;
  return {
    active: activeIds.size > 0,
    activeRunIds: [...activeIds],
    pending: runs.some((r) => r.phase === "sending"),
    queued: Math.max(queuedLocal, queuedRow),
  };
}
