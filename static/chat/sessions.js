// Sessions as the sidebar knows them (`state.rows`): committed rows from the server, the runs a
// newer row settles, deleted sessions (tombstones), the sidebar's list and search. Pure.

import { TERMINAL_PHASES, effect, runKey } from "./model.js";
import { canonicalKey, shortName } from "./policy.js";
import { putRun, runsOf, settle } from "./runs.js";
import { dropSessionTools, needsApproval } from "./tools.js";

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

function sortedRows(s) {
  return Object.values(s.rows).sort(
    (a, b) => (b.updatedAt || 0) - (a.updatedAt || 0) || String(a.key).localeCompare(String(b.key)),
  );
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

/** A row from the server (an event, a list, an answer): kept when newer than the one held; false when not. */
export function acceptRow(s, row) {
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

/** Session `key` was deleted (`row`: its last row, when known): it goes, with its runs and tool calls. */
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
  dropSessionTools(s, key);
  if (s.currentKey === key) {
    const next = sortedRows(s)[0];
    s.currentKey = next ? next.key : s.mainKey;
    effect(s, { type: "history", key: s.currentKey });
    effect(s, { type: "draft", key: s.currentKey });
  }
}

/** A `sessions.list` page (asked at tick `token`): its rows; the whole list also drops rows it lacks. */
function onListLoaded(s, action) {
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
}

/** The reducer's actions of sessions and the sidebar (state.js puts them in its table). */
export const sessionHandlers = {
  "session/select": (s, action) => {
    const key = canonicalKey(action.key, "main", s.policy) || s.mainKey;
    s.currentKey = key;
    effect(s, { type: "history", key });
    effect(s, { type: "draft", key });
  },
  "session/row": (s, action) => {
    acceptRow(s, action.row);
  },
  "session/deleted": (s, action) => removeSession(s, action.key, null),
  "list/loaded": onListLoaded,
  "search/set": (s, action) => {
    s.search = String(action.text || "").trim();
    s.listNext = null;
    effect(s, { type: "list" });
  },
};

// --- selectors -------------------------------------------------------------------------------------

/** The name session `key` goes by: its label, else the short name of its key. */
export function sessionLabel(state, key) {
  const row = state.rows[key];
  return (row && row.label) || shortName(key);
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
    label: sessionLabel(state, row.key),
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
