// Sending a message (`chat.send`): the request, its ack (PROTOCOL.md §4), a send that got no answer,
// and the outbox of sends that should go out now. Pure.
//
// The rule that matters most: a chat.send ack is a tagged union. `started` / `queued` / `in_flight`
// keep the run pending; `ok` completes it at once; `timeout` / `error` end it, clear the pending
// state and show the failure. A terminal ack is never followed by events, so nothing may wait for
// them.

import { inlineCommand } from "./commands.js";
import { TERMINAL_PHASES, effect, inTranscript, runKey } from "./model.js";
import { canonicalKey } from "./policy.js";
import { activity, newRun, putRun, settle } from "./runs.js";
import { ackSteered } from "./steering.js";

// --- acks ----------------------------------------------------------------------------------

/** `started`, `queued`, `in_flight`: the server has the run; a run that ended already stays ended. */
function ackPending(s, r, status, payload) {
  r.ackTick = s.tick;
  if (payload.steered === true && ackSteered(r, payload)) {
    putRun(s, r);
    return;
  }
  if (!TERMINAL_PHASES.has(r.phase) && (r.phase === "sending" || r.phase === "queued")) {
    const queued = status === "queued" || (status === "in_flight" && payload.queuePosition);
    r.phase = queued ? "queued" : "started";
    r.position = queued ? payload.queuePosition || r.position || null : null;
  }
  putRun(s, r);
}

/** `ok`: done at once with its `reply`, or an inline command (no run exists) was carried out. */
function ackOk(s, key, r, payload) {
  if (payload.command) {
    // An inline command (/stop, /new, /reset): no run exists; reload what it changed.
    const runs = { ...s.runs };
    delete runs[runKey(key, r.id)];
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
}

/** `timeout`, `error`: the run ended; the failure shows on the message (or on the reply, when delivered). */
function ackFailed(s, key, r, payload, response) {
  const status = payload.status;
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
}

function onAck(s, { key, runId, response }) {
  const run = s.runs[runKey(key, runId)];
  if (!run) return;
  const payload = (response && response.payload) || {};
  const status = payload.status;
  if (!status) {
    onSendFailed(s, { key, runId, error: response && response.error });
    return;
  }
  const r = { ...run };
  if (payload.sessionId) r.sessionId = payload.sessionId;
  switch (status) {
    case "started":
    case "queued":
    case "in_flight":
      ackPending(s, r, status, payload);
      return;
    case "ok":
      ackOk(s, key, r, payload);
      return;
    case "timeout":
    case "error":
      ackFailed(s, key, r, payload, response);
      return;
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

// --- requests --------------------------------------------------------------------------------

/** A message to send (typed, retried, or restored from storage with `restored`). */
function onSendRequest(s, action) {
  const key = canonicalKey(action.key, "main", s.policy) || s.currentKey;
  if (s.runs[runKey(key, action.runId)]) return;
  const attachments = Array.isArray(action.attachments) ? action.attachments : [];
  // Typed while a run of the session works: it goes into that run (a steer), unless the user asked
  // to queue it (`queue`) or it is an inline command (those act on the session, never steer).
  // A restored send keeps the mode it first went out with (the server knows its key by it).
  const steer = !action.queue && activity(s, key).active && !inlineCommand(action.text, s.commands);
  const queueMode = action.restored ? action.queueMode || null : steer ? "steer" : null;
  putRun(s, newRun(s, key, action.runId, { phase: "sending", userText: action.text, own: true, attachments, queueMode }));
  if (!action.restored && !action.keepDraft) {
    s.drafts = { ...s.drafts, [key]: "" };
    effect(s, { type: "draft", key });
  }
  effect(s, { type: "flush" });
}

/** The request never got an answer (the socket closed): it goes out again on the next connection. */
function onSendUnsent(s, action) {
  const run = s.runs[runKey(action.key, action.runId)];
  if (!run || run.phase !== "sending") return;
  const command = inlineCommand(run.userText, s.commands);
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
    return;
  }
  putRun(s, { ...run, sentGen: null });
}

/** The reducer's actions of sending (state.js puts them in its table). */
export const sendHandlers = {
  "send/request": onSendRequest,
  "send/sent": (s, action) => {
    const run = s.runs[runKey(action.key, action.runId)];
    if (run) putRun(s, { ...run, sentGen: action.gen });
  },
  "send/ack": onAck,
  "send/failed": onSendFailed,
  "send/unsent": onSendUnsent,
};

// --- selectors -------------------------------------------------------------------------------------

/** chat.send requests that should go out now: unsent, or sent on a connection that is gone. */
export function outbox(state) {
  if (state.conn.status !== "online") return [];
  return Object.values(state.runs)
    .filter((r) => r.phase === "sending" && r.sentGen !== state.conn.gen)
    .sort((a, b) => a.order - b.order);
}
