// The page's connection to the gateway: the client (client.js) and the requests that load what the
// page shows into the store. Browser only.

import { GatewayClient } from "./client.js";
import { reportFailure } from "./failures.js";
import { outbox } from "./sends.js";
import { dispatch, state } from "./store.js";
import { coalesce } from "./util.js";
import { root } from "./view.js";

const PAGE_SIZE = 50;
const LIST_LIMIT = 200;

const wsUrl = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}${root.dataset.wsPath || "/ws/gateway"}`;
export const client = new GatewayClient({
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
    requestCommands();
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
export const requestHistory = coalesce(
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

/** The page before the oldest message loaded of session `key`, when there is one. */
export function requestOlder(key) {
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
export const requestList = coalesce(() => {
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
export const requestMoreSessions = coalesce(
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
export const requestApprovals = coalesce(() => {
  if (!client.ready) return null;
  const token = state.tick;
  return client
    .request("plugin.approval.list", {})
    .then((res) => {
      if (res.ok) dispatch({ type: "approvals/listed", token, at: Date.now(), payload: res.payload });
    })
    .catch(() => {});
});

/** Ask `method` once; its answer becomes action `type` with the payload (no answer, no action). */
function load(method, type) {
  client
    .request(method, {})
    .then((res) => {
      if (res.ok) dispatch({ type, payload: res.payload });
    })
    .catch(() => {});
}

/** The agents, for the agent picker and the header. */
const requestAgents = () => load("agents.list", "agents/loaded");

/** The gateway's inline commands (commands.js); until they arrive the page goes by its fallback. */
const requestCommands = () => load("commands.list", "commands/loaded");

/** Send what the outbox holds (sends.js `outbox`): unsent, or sent on a connection that is gone. */
export function flushOutbox() {
  for (const run of outbox(state)) {
    const { key, id } = run;
    dispatch({ type: "send/sent", key, runId: id, gen: state.conn.gen });
    const params = { sessionKey: key, message: run.userText, idempotencyKey: id };
    if (run.attachments && run.attachments.length) params.attachments = run.attachments.map((a) => ({ fileId: a.fileId }));
    if (run.queueMode) params.queueMode = run.queueMode; // the same mode on every resend of the key
    client
      .request("chat.send", params)
      .then((response) => dispatch({ type: "send/ack", key, runId: id, response }))
      .catch((error) => {
        // No answer: the socket went away (or the request timed out). Same key, next connection.
        dispatch({ type: "send/unsent", key, runId: id });
        if (error.code !== "DISCONNECTED") setTimeout(flushOutbox, 1000);
      });
  }
}

/** One request whose failure becomes a notice saying what failed; its payload, or null. */
export async function call(method, params, what = method) {
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
