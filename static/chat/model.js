// The ground floor of the chat page's state modules: how runs are keyed in the state, what their
// phases mean, a conversation's empty shape, and the effect list. Every other state module may
// import this one; it imports nothing.
//
// The state modules are pure: no DOM, no timers, no I/O. A reducer step works on a draft `s` (a
// shallow copy of the state) and replaces the objects it changes, never changes the old ones.

/** Phases a run ends in: exactly one terminal per run. */
export const TERMINAL_PHASES = new Set(["final", "error", "aborted"]);
/** Phases of a run the server is running (Stop applies). */
export const ACTIVE_PHASES = new Set(["started", "streaming"]);

/** The key of run `runId` of session `key` in `state.runs`. */
export const runKey = (key, runId) => `${key}|${runId}`;

/** Run `runId` of session `key`, or null (also when there is no run id). */
export function runOf(s, key, runId) {
  return runId ? s.runs[runKey(key, runId)] || null : null;
}

/** A conversation (history) of a session before anything was loaded. */
export function emptyConv() {
  return { loaded: false, loading: false, loadingOlder: false, hasMore: false, sessionId: null, inFlightRunId: null, messages: [] };
}

/**
 * Ask the page for `eff` after this step (`state.effects`). One history reload per session, one
 * sidebar reload and one approvals reload per step are enough.
 */
export function effect(s, eff) {
  if (eff.type === "history" && s.effects.some((e) => e.type === "history" && e.key === eff.key)) return;
  if ((eff.type === "list" || eff.type === "approvals") && s.effects.some((e) => e.type === eff.type)) return;
  s.effects.push(eff);
}

/** Does the loaded conversation of `key` hold a message (the user's or a reply) of run `runId`? */
export function inTranscript(s, key, runId) {
  const conv = s.convs[key];
  return Boolean(conv) && conv.messages.some((m) => m && m.runId === runId);
}
