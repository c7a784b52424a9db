// Chat page state: a pure reducer over protocol v4 frames and user actions.
//
// No DOM, no timers, no I/O: `reduce(state, action)` returns a new state, and
// whatever must happen outside (a history reload, putting a draft back in the
// composer, a retry) is listed in `state.effects` for the caller to carry out.
// The page (app.js) and the Node unit tests (tests/js/) both import this file.
//
// `reduce` looks the action up in one table of handlers, each working on the
// draft state. The handlers live with their subject: sends.js (chat.send and
// its acks, §4), runs.js (`chat` events), sessions.js (rows and the sidebar),
// history.js (chat.history), tools.js (approvals answered, TOOLS.md §13);
// this file holds the connection, the event frames and the rest. model.js is
// what they all share; the selectors are in those modules and conversation.js.

import { FALLBACK_COMMANDS, commandsFrom } from "./commands.js";
import { branchHandlers } from "./branches.js";
import { historyHandlers } from "./history.js";
import { effect } from "./model.js";
import { DEFAULT_POLICY, policyFrom } from "./policy.js";
import { onChat } from "./runs.js";
import { sendHandlers } from "./sends.js";
import { acceptRow, sessionHandlers } from "./sessions.js";
import { failureText } from "./texts.js";
import { approvalHandlers, initialToolState, onAgentEvent, onApprovalRequested, onApprovalResolved, onServerTime } from "./tools.js";

/** True when event `seq` does not follow `lastSeq` (§1): events were lost, resync. */
export function isSeqGap(lastSeq, seq) {
  return lastSeq > 0 && seq !== lastSeq + 1;
}

/** The state of a page that has loaded nothing yet: session `currentKey` open, `drafts` restored. */
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
    commands: FALLBACK_COMMANDS, // the inline commands ({bare, withArgs}), from commands.list
    agents: null, // {list: [{id, name, model (its name), backend}], defaultId} from agents.list
    search: "", // sidebar search (server-side through sessions.list `search`)
    listNext: null, // {search, offset}: where the next page of the sidebar starts, or null
    notice: null,
    ...initialToolState(), // tools: toolCallId -> call; approvals: id -> approval; clockOffsetMs
    effects: [],
  };
}

// --- the connection ----------------------------------------------------------------------------

function onReady(s, action) {
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
}

/** What each event frame does, by its `event`: `(s, payload, action)`. */
const EVENT_HANDLERS = new Map(
  Object.entries({
    chat: (s, p) => onChat(s, p),
    "sessions.changed": (s, p) => acceptRow(s, p && p.session),
    agent: (s, p) => onAgentEvent(s, p),
    "plugin.approval.requested": (s, p, action) => onApprovalRequested(s, p, action.at),
    "plugin.approval.resolved": (s, p) => onApprovalResolved(s, p),
    tick: (s, p, action) => p && onServerTime(s, p.ts, action.at),
    "connect.challenge": (s, p, action) => p && onServerTime(s, p.ts, action.at),
    shutdown: (s) => {
      s.notice = { text: "The server is restarting; this page reconnects by itself.", tick: s.tick, kind: "conn" };
    },
  }),
);

function onEvent(s, action) {
  const frame = action.frame || {};
  if (typeof frame.seq === "number") {
    if (isSeqGap(s.conn.lastSeq, frame.seq)) {
      effect(s, { type: "list" });
      effect(s, { type: "history", key: s.currentKey });
      effect(s, { type: "approvals" });
    }
    s.conn = { ...s.conn, lastSeq: frame.seq };
  }
  const handle = EVENT_HANDLERS.get(frame.event);
  if (handle) handle(s, frame.payload, action);
}

const connectionHandlers = {
  "conn/connecting": (s) => {
    s.conn = { ...s.conn, status: "connecting", retryInMs: null };
  },
  "conn/open": (s) => {
    s.conn = { ...s.conn, lastSeq: 0 };
  },
  "conn/ready": onReady,
  "conn/closed": (s, action) => {
    s.conn = { ...s.conn, status: "offline", retryInMs: action.retryInMs ?? null, error: action.error || null };
  },
  event: onEvent,
};

// --- the rest: answers that are not a subject's own, and the page's own actions ----------------------

const otherHandlers = {
  "agents/loaded": (s, action) => {
    const payload = action.payload || {};
    const list = (Array.isArray(payload.agents) ? payload.agents : [])
      .filter((a) => a && typeof a.id === "string")
      // the model comes as OpenClaw's {primary}; the page shows its name
      .map((a) => ({ ...a, model: typeof a.model === "string" ? a.model : (a.model && a.model.primary) || "" }));
    s.agents = { list, defaultId: payload.defaultId || "main" };
  },
  "commands/loaded": (s, action) => {
    // commands.list answered: the gateway's inline commands replace what the page went by.
    s.commands = commandsFrom(action.payload) || s.commands;
  },
  "draft/set": (s, action) => {
    s.drafts = { ...s.drafts, [action.key]: action.text };
  },
  notice: (s, action) => {
    s.notice = action.text ? { text: action.text, tick: s.tick } : null;
  },
  "stop/answered": (s, action) => {
    // The chat.abort answers for `key`: a refusal is shown; when none stopped anything, the
    // run had ended already (its terminal may be missing here), so the conversation is reloaded.
    const results = action.results || [];
    const failed = results.find((r) => !r.ok);
    if (failed) s.notice = { text: failureText("Stop", failed.error), tick: s.tick };
    else if (results.every((r) => !(r.payload && r.payload.aborted))) effect(s, { type: "history", key: action.key });
  },
};

// --- the reducer ---------------------------------------------------------------------------------

/** One table from the subjects' tables; an action type handled twice is a mistake in this page. */
function tableOf(...tables) {
  const table = new Map();
  for (const handlers of tables) {
    for (const [type, handle] of Object.entries(handlers)) {
      if (table.has(type)) throw new Error(`two handlers for ${type}`);
      table.set(type, handle);
    }
  }
  return table;
}

/** Every action the reducer knows, by `type`: `(s, action)` changes the draft state `s`. */
const HANDLERS = tableOf(connectionHandlers, sendHandlers, sessionHandlers, historyHandlers, branchHandlers, approvalHandlers, otherHandlers);

/** Apply one action; returns the next state (the input is not changed). An unknown action changes only `tick`. */
export function reduce(state, action) {
  const s = { ...state, tick: state.tick + 1, effects: [] };
  const handle = HANDLERS.get(action.type);
  if (handle) handle(s, action);
  return s;
}
