// Unit tests of the state module's page features: policy from hello-ok, run details, message
// actions (retry, edit), sidebar search and paging, the offline outbox and drafts.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { conversation, editTarget, retryTarget } from "../../static/chat/conversation.js";
import { DEFAULT_POLICY, canonicalKey, policyFrom } from "../../static/chat/policy.js";
import { sessionList } from "../../static/chat/sessions.js";
import { initialState, reduce } from "../../static/chat/state.js";
import { storedDrafts, storedOutbox } from "../../static/chat/storage.js";
import { failureText, formatDetails } from "../../static/chat/texts.js";
import { detailsOf } from "../../static/chat/transcript.js";
import { RequestError } from "../../static/chat/client.js";
import { GEN, KEY, run } from "./support.mjs";



function online(policy = {}) {
  return run(initialState(), [
    { type: "conn/open" },
    { type: "conn/ready", hello: { auth: { user: "alice" }, policy, snapshot: { sessionDefaults: { mainSessionKey: KEY } } } },
  ]);
}

function chatEvent(s, payload) {
  const frame = { type: "event", event: "chat", payload: { sessionKey: KEY, sessionId: GEN, ...payload }, seq: s.conn.lastSeq + 1 };
  return reduce(s, { type: "event", frame });
}

function ack(s, runId, status, extra = {}) {
  const response = { type: "res", id: "x", ok: status !== "error", payload: { runId, status, sessionKey: KEY, sessionId: GEN, ...extra } };
  return reduce(s, { type: "send/ack", key: KEY, runId, response });
}

function finished(s, runId, text, extra = {}) {
  let t = reduce(s, { type: "send/request", key: KEY, runId, text });
  t = ack(t, runId, "started");
  return chatEvent(t, { runId, seq: 1, state: "final", message: { role: "assistant", content: [{ type: "text", text: `echo: ${text}` }] }, ...extra });
}

function row(fields = {}) {
  return { key: KEY, sessionId: GEN, agentId: "main", label: "", status: null, hasActiveRun: false, activeRunIds: [], queuedRunIds: [], version: 1, createdAt: 1, updatedAt: 1, ...fields };
}

describe("policy from hello-ok", () => {
  test("defaults until hello-ok, then the server's values", () => {
    assert.equal(initialState().policy.maxMessageChars, 32000);
    const s = online({ maxMessageChars: 500, sessionKeyNamePattern: "^[a-z]{1,5}$", agentIdPattern: "^[a-z]{1,3}$" });
    assert.equal(s.policy.maxMessageChars, 500);
    assert.equal(canonicalKey("abc", "main", s.policy), "agent:main:abc");
    assert.equal(canonicalKey("abcdef", "main", s.policy), null);
    assert.equal(canonicalKey("agent:ops:x", "main", s.policy), "agent:ops:x");
    assert.equal(canonicalKey("agent:toolong:x", "main", s.policy), null);
  });

  test("a missing or unusable field keeps the built-in value", () => {
    const p = policyFrom({ policy: { maxMessageChars: -1, sessionKeyNamePattern: "([", agentIdPattern: 3 } });
    assert.equal(p.maxMessageChars, DEFAULT_POLICY.maxMessageChars);
    assert.equal(p.keyNameRe, DEFAULT_POLICY.keyNameRe);
    assert.equal(p.agentIdRe, DEFAULT_POLICY.agentIdRe);
    assert.deepEqual(policyFrom(null), { ...DEFAULT_POLICY });
  });

  test("session/select validates with the server's pattern", () => {
    const s = online({ sessionKeyNamePattern: "^[a-z]+$" });
    assert.equal(reduce(s, { type: "session/select", key: "Work" }).currentKey, KEY);
    assert.equal(reduce(s, { type: "session/select", key: "work" }).currentKey, "agent:main:work");
  });
});

describe("run details", () => {
  test("detailsOf and formatDetails", () => {
    assert.equal(detailsOf({}), null);
    assert.deepEqual(detailsOf({ durationMs: 1234, usage: { promptTokens: 3, completionTokens: 4 } }), {
      durationMs: 1234,
      promptTokens: 3,
      completionTokens: 4,
    });
    assert.equal(formatDetails({ durationMs: 1234, promptTokens: 3, completionTokens: 4 }), "1.2 s · 3 in / 4 out tokens");
    assert.equal(formatDetails({ durationMs: 80 }), "80 ms");
    assert.equal(formatDetails({ durationMs: 125000 }), "2 min 5 s");
    assert.equal(formatDetails({ completionTokens: 9 }), "9 out tokens");
    assert.equal(formatDetails(null), "");
  });

  test("the final event's details reach the reply; history messages carry their own", () => {
    let s = finished(online(), "r1", "hi", { durationMs: 900, usage: { promptTokens: 1, completionTokens: 2 } });
    const reply = conversation(s, KEY).find((i) => i.role === "assistant");
    assert.deepEqual(reply.details, { durationMs: 900, promptTokens: 1, completionTokens: 2 });
    s = reduce(s, {
      type: "history/loaded",
      key: KEY,
      token: s.tick,
      payload: {
        sessionKey: KEY,
        sessionId: GEN,
        hasMore: false,
        queuedRuns: [],
        messages: [
          { id: "1", role: "user", content: [{ type: "text", text: "hi" }], runId: "r1" },
          { id: "2", role: "assistant", content: [{ type: "text", text: "echo: hi" }], runId: "r1", durationMs: 950, usage: { completionTokens: 2 } },
        ],
      },
    });
    const fromHistory = conversation(s, KEY).find((i) => i.role === "assistant");
    assert.deepEqual(fromHistory.details, { durationMs: 950, completionTokens: 2 });
  });

  test("an error item carries its kind", () => {
    let s = reduce(online(), { type: "send/request", key: KEY, runId: "e1", text: "x" });
    s = ack(s, "e1", "started");
    s = chatEvent(s, { runId: "e1", seq: 1, state: "status", phase: "running" });
    s = chatEvent(s, { runId: "e1", seq: 2, state: "error", errorKind: "dispatch", errorMessage: "nope" });
    const reply = conversation(s, KEY).find((i) => i.role === "assistant");
    assert.equal(reply.errorKind, "dispatch");
    assert.equal(reply.error, "nope");
  });
});

describe("message actions", () => {
  test("retry: the last finished reply's user text, enabled only when the session is idle", () => {
    let s = finished(online(), "r1", "question");
    const target = retryTarget(s, KEY);
    assert.deepEqual(target, { itemId: "a:r1", runId: "r1", text: "question", enabled: true });
    s = reduce(s, { type: "send/request", key: KEY, runId: "r2", text: "next" });
    assert.equal(retryTarget(s, KEY), null); // the last item is the pending send
    s = ack(s, "r2", "started");
    assert.equal(retryTarget(s, KEY), null); // streaming
  });

  test("retry is disabled while another run of the session is active", () => {
    let s = finished(online(), "r1", "question");
    s = run(s, [{ type: "session/row", row: row({ hasActiveRun: true, activeRunIds: ["other"], status: "running", version: 2 }) }]);
    assert.equal(retryTarget(s, KEY).enabled, false);
  });

  test("retry of a stopped or failed reply and of a refused send; never of a command", () => {
    let s = reduce(online(), { type: "send/request", key: KEY, runId: "k1", text: "stop me" });
    s = ack(s, "k1", "started");
    s = chatEvent(s, { runId: "k1", seq: 1, state: "aborted", stopReason: "rpc" });
    assert.equal(retryTarget(s, KEY).text, "stop me");
    s = reduce(s, { type: "send/request", key: KEY, runId: "f1", text: "refused" });
    s = reduce(s, { type: "send/ack", key: KEY, runId: "f1", response: { ok: false, error: { code: "UNAVAILABLE", message: "no" }, payload: { runId: "f1", status: "error", summary: "no" } } });
    const refused = retryTarget(s, KEY);
    assert.equal(refused.itemId, "u:f1");
    assert.equal(refused.text, "refused");
    s = finished(s, "c1", "/new");
    assert.equal(retryTarget(s, KEY), null);
  });

  test("edit: the last user message, not while it is still being sent", () => {
    let s = finished(online(), "r1", "first");
    s = finished(s, "r2", "second");
    assert.deepEqual(editTarget(s, KEY), { itemId: "u:r2", runId: "r2", text: "second" });
    s = reduce(s, { type: "send/request", key: KEY, runId: "r3", text: "third" });
    assert.equal(editTarget(s, KEY), null);
  });

  test("a retry keeps the composer's draft when asked to", () => {
    let s = finished(online(), "r1", "question");
    s = reduce(s, { type: "draft/set", key: KEY, text: "typing" });
    s = reduce(s, { type: "send/request", key: KEY, runId: "r2", text: "question", keepDraft: true });
    assert.equal(s.drafts[KEY], "typing");
  });
});

describe("sidebar search and paging", () => {
  const rows = [row({ key: "agent:main:alpha", label: "Shopping", updatedAt: 3 }), row({ key: "agent:main:beta", label: "Work", updatedAt: 2 })];

  test("search filters by key or label, case-insensitively, and asks the server", () => {
    let s = reduce(online(), { type: "list/loaded", token: 0, search: "", offset: 0, payload: { sessions: rows, hasMore: false } });
    s = reduce(s, { type: "search/set", text: "  SHOP " });
    assert.equal(s.search, "SHOP");
    assert.ok(s.effects.some((e) => e.type === "list"));
    assert.deepEqual(sessionList(s).map((i) => i.key), ["agent:main:alpha"]);
    s = reduce(s, { type: "search/set", text: "beta" });
    assert.deepEqual(sessionList(s).map((i) => i.key), ["agent:main:beta"]);
  });

  test("a search result never prunes rows; a complete unsearched list does", () => {
    let s = reduce(online(), { type: "list/loaded", token: 0, search: "", offset: 0, payload: { sessions: rows, hasMore: false } });
    s = reduce(s, { type: "search/set", text: "shop" });
    s = reduce(s, { type: "list/loaded", token: s.tick, search: "shop", offset: 0, payload: { sessions: [rows[0]], hasMore: false } });
    assert.ok(s.rows["agent:main:beta"]);
    s = reduce(s, { type: "search/set", text: "" });
    s = reduce(s, { type: "list/loaded", token: s.tick, search: "", offset: 0, payload: { sessions: [rows[0]], hasMore: false } });
    assert.equal(s.rows["agent:main:beta"], undefined);
  });

  test("listNext follows nextOffset for the current search; later pages never prune", () => {
    let s = reduce(online(), { type: "list/loaded", token: 0, search: "", offset: 0, payload: { sessions: [rows[0]], hasMore: true, nextOffset: 1 } });
    assert.deepEqual(s.listNext, { search: "", offset: 1 });
    s = reduce(s, { type: "list/loaded", token: s.tick, search: "", offset: 1, payload: { sessions: [rows[1]], hasMore: false, nextOffset: null } });
    assert.equal(s.listNext, null);
    assert.ok(s.rows["agent:main:alpha"] && s.rows["agent:main:beta"]);
    // A page of an older search does not move the current one's paging.
    s = reduce(s, { type: "search/set", text: "x" });
    s = reduce(s, { type: "list/loaded", token: s.tick, search: "old", offset: 0, payload: { sessions: [], hasMore: true, nextOffset: 200 } });
    assert.equal(s.listNext, null);
  });
});

describe("offline outbox and drafts", () => {
  test("unacked sends are stored, and leave once their ack arrives", () => {
    let s = run(initialState(), [
      { type: "send/request", key: KEY, runId: "w1", text: "one" },
      { type: "send/request", key: KEY, runId: "w2", text: "two" },
    ]);
    assert.deepEqual(storedOutbox(s), [
      { key: KEY, runId: "w1", text: "one" },
      { key: KEY, runId: "w2", text: "two" },
    ]);
    s = run(s, [{ type: "conn/open" }, { type: "conn/ready", hello: {} }]);
    s = reduce(s, { type: "send/sent", key: KEY, runId: "w1", gen: s.conn.gen });
    assert.equal(storedOutbox(s).length, 2); // sent, but not answered yet
    s = ack(s, "w1", "started");
    assert.deepEqual(storedOutbox(s), [{ key: KEY, runId: "w2", text: "two" }]);
  });

  test("a send's attachments are kept with it, stored with the outbox and shown on its message", () => {
    const files = [{ fileId: "file-" + "a".repeat(32), fileName: "chart.png", mimeType: "image/png", size: 1234 }];
    let s = run(initialState(), [{ type: "send/request", key: KEY, runId: "w1", text: "", attachments: files }]);
    assert.deepEqual(storedOutbox(s), [{ key: KEY, runId: "w1", text: "", attachments: files }]);
    const [mine] = conversation(s, KEY).filter((item) => item.role === "user");
    assert.deepEqual(mine.attachments, files);
    s = run(s, [{ type: "conn/open" }, { type: "conn/ready", hello: {} }]);
    s = ack(s, "w1", "started");
    assert.deepEqual(storedOutbox(s), []);
  });

  test("a restored send keeps its key and does not clear the draft", () => {
    let s = initialState({ drafts: { [KEY]: "half a thought" } });
    s = reduce(s, { type: "send/request", key: KEY, runId: "w1", text: "stored", restored: true });
    assert.equal(s.drafts[KEY], "half a thought");
    assert.equal(s.runs[`${KEY}|w1`].id, "w1");
    assert.deepEqual(storedDrafts(s), { [KEY]: "half a thought" });
    s = reduce(s, { type: "draft/set", key: KEY, text: "  " });
    assert.deepEqual(storedDrafts(s), {});
  });
});

describe("failure notices say what failed", () => {
  test("a gateway error response: its message and code, and when to retry", () => {
    const text = failureText("sessions.create", { code: "NOT_FOUND", message: "unknown agent: ghost", details: { field: "agentId" } });
    assert.equal(text, "sessions.create failed: unknown agent: ghost (NOT_FOUND)");
    assert.equal(
      failureText("sessions.patch", { code: "RATE_LIMITED", message: "too many requests on this connection", retryAfterMs: 1200 }),
      "sessions.patch failed: too many requests on this connection (RATE_LIMITED; try again in 2 s)",
    );
    assert.equal(failureText("sessions.reset", { code: "INTERNAL" }), "sessions.reset failed: INTERNAL");
  });

  test("a timeout is a timeout, not a lost connection", () => {
    const text = failureText("sessions.create", new RequestError("TIMEOUT", "no response to sessions.create", { sent: true, timeoutMs: 30000 }));
    assert.equal(text, "sessions.create timed out: no answer from the gateway within 30 s. It may still take effect; check before trying again.");
    assert.doesNotMatch(text, /not connected/i);
  });

  test("only a closed socket says not connected, and whether the request went out", () => {
    assert.equal(
      failureText("sessions.create", new RequestError("DISCONNECTED", "not connected")),
      "Not connected: sessions.create was not sent. Try again when the connection is back.",
    );
    assert.equal(
      failureText("sessions.delete", new RequestError("DISCONNECTED", "connection closed", { sent: true })),
      "Not connected: the connection closed before sessions.delete was answered. Check whether it took effect once the connection is back.",
    );
  });

  test("an exception in the page is named as one", () => {
    const text = failureText("New chat", new TypeError("Cannot read properties of undefined (reading 'key')"));
    assert.equal(text, "New chat failed in this page: TypeError: Cannot read properties of undefined (reading 'key')");
    assert.equal(failureText("Rename", undefined), "Rename failed: no reason given");
  });
});

describe("stop answers (chat.abort)", () => {
  const answer = (ok, payload, error) => ({ type: "res", id: "x", ok, payload, error });

  test("nothing stopped: the run had ended already, so the conversation is reloaded", () => {
    const s = reduce(online(), { type: "stop/answered", key: KEY, results: [answer(true, { aborted: false }), answer(true, { aborted: false })] });
    assert.deepEqual(s.effects, [{ type: "history", key: KEY }]);
    assert.equal(s.notice, null);
  });

  test("a run stopped: no reload (its events say the rest)", () => {
    const s = reduce(online(), { type: "stop/answered", key: KEY, results: [answer(true, { aborted: false }), answer(true, { aborted: true })] });
    assert.deepEqual(s.effects, []);
    assert.equal(s.notice, null);
  });

  test("a refusal becomes a notice saying what failed, and nothing is reloaded", () => {
    const s = reduce(online(), {
      type: "stop/answered",
      key: KEY,
      results: [answer(true, { aborted: false }), answer(false, undefined, { code: "FORBIDDEN", message: "not yours" })],
    });
    assert.deepEqual(s.effects, []);
    assert.equal(s.notice.text, failureText("Stop", { code: "FORBIDDEN", message: "not yours" }));
  });
});
