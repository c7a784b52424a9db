// Unit tests of the chat page's pure state module (static/chat/state.js), run by `node --test tests/js/`.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { inlineCommand } from "../../static/chat/commands.js";
import { conversation } from "../../static/chat/conversation.js";
import { canonicalKey } from "../../static/chat/policy.js";
import { activity } from "../../static/chat/runs.js";
import { outbox } from "../../static/chat/sends.js";
import { isNewerRow, sessionList } from "../../static/chat/sessions.js";
import { initialState, isSeqGap, reduce } from "../../static/chat/state.js";
import { GEN, KEY, OTHER, run } from "./support.mjs";


// --- helpers ------------------------------------------------------------------------------------


/** A connected page with the main session open. */
function online() {
  return run(initialState(), [
    { type: "conn/open" },
    { type: "event", frame: { type: "event", event: "connect.challenge", payload: {}, seq: 1 } },
    { type: "conn/ready", hello: { auth: { user: "alice" }, snapshot: { sessionDefaults: { mainSessionKey: KEY } } } },
  ]);
}

let seqCounter = 100;
function event(name, payload) {
  seqCounter += 1;
  return { type: "event", frame: { type: "event", event: name, payload, seq: seqCounter } };
}

/** Event frames with consecutive connection seq numbers, starting after `state.conn.lastSeq`. */
function events(state, list) {
  let s = state;
  for (const [name, payload] of list) {
    s = reduce(s, { type: "event", frame: { type: "event", event: name, payload, seq: s.conn.lastSeq + 1 } });
  }
  return s;
}

function send(state, runId, text = "hello", key = KEY) {
  return reduce(state, { type: "send/request", key, runId, text });
}

function ack(state, runId, payload, { ok = true, error = null, key = KEY } = {}) {
  const response = { type: "res", id: "x", ok, payload: { runId, sessionKey: key, sessionId: GEN, ...payload } };
  if (error) response.error = error;
  return reduce(state, { type: "send/ack", key, runId, response });
}

function chat(runId, seq, state, extra = {}, key = KEY) {
  return ["chat", { runId, sessionKey: key, sessionId: GEN, seq, state, ...extra }];
}

function delta(runId, seq, text, key = KEY) {
  return chat(runId, seq, "delta", { deltaText: "", message: { role: "assistant", content: [{ type: "text", text }] } }, key);
}

function row(fields = {}) {
  return {
    key: KEY,
    sessionId: GEN,
    agentId: "main",
    label: "",
    kind: "direct",
    status: null,
    hasActiveRun: false,
    activeRunIds: [],
    queuedRunIds: [],
    lastRunId: null,
    startedAt: null,
    endedAt: null,
    runtimeMs: null,
    abortedLastRun: false,
    lastRunError: null,
    version: 1,
    createdAt: 1000,
    updatedAt: 1000,
    ...fields,
  };
}

function changed(r, reason = "send") {
  return ["sessions.changed", { sessionKey: r.key, reason, ts: 1, session: r }];
}

function history(state, payload, key = KEY, token = state.tick) {
  return reduce(state, {
    type: "history/loaded",
    key,
    token,
    payload: { sessionKey: key, sessionId: GEN, messages: [], hasMore: false, session: null, queuedRuns: [], ...payload },
  });
}

function msg(id, role, text, runId, extra = {}) {
  return { id: String(id), role, content: [{ type: "text", text }], runId, timestamp: 1, ...extra };
}

const items = (s, key = KEY) => conversation(s, key);
const byRole = (s, role, key = KEY) => items(s, key).filter((i) => i.role === role);

// --- basics -----------------------------------------------------------------------------------------

describe("helpers", () => {
  test("canonical session keys", () => {
    assert.equal(canonicalKey("main"), "agent:main:main");
    assert.equal(canonicalKey("agent:ops:x:y"), "agent:ops:x:y");
    assert.equal(canonicalKey("bad key"), null);
    assert.equal(canonicalKey(""), null);
  });

  test("seq gaps", () => {
    assert.equal(isSeqGap(0, 1), false);
    assert.equal(isSeqGap(4, 5), false);
    assert.equal(isSeqGap(4, 6), true);
    assert.equal(isSeqGap(4, 4), true);
  });

  test("row order: version within a session, createdAt across re-created keys", () => {
    assert.ok(isNewerRow(row({ version: 3 }), row({ version: 2 })));
    assert.ok(!isNewerRow(row({ version: 2 }), row({ version: 2 })));
    assert.ok(isNewerRow(row({ version: 1, createdAt: 2000 }), row({ version: 9, createdAt: 1000 })));
  });

  test("inline commands are named as the gateway parses them", () => {
    for (const [text, name] of [
      ["/stop", "/stop"],
      [" /status ", "/status"],
      ["/think", "/think"],
      ["/think high", "/think"],
      ["/model openai/gpt-4o", "/model"],
      ["/verbose on", "/verbose"],
    ]) {
      assert.equal(inlineCommand(text), name, JSON.stringify(text));
    }
    for (const text of ["/status now", "/new chat", "/thinking", "hello /stop", "", null]) {
      assert.equal(inlineCommand(text), null, JSON.stringify(text));
    }
  });

  test("agents.list: the model comes as OpenClaw's {primary}, the page keeps its name", () => {
    const payload = {
      agents: [
        { id: "main", name: "main", model: { primary: "scripted" }, backend: "scripted" },
        { id: "bare", name: "bare", model: {}, backend: "scripted" },
        { id: "old", name: "old", model: "tiny-1", backend: "scripted" },
      ],
      defaultId: "main",
    };
    const s = reduce(online(), { type: "agents/loaded", payload });
    assert.deepEqual(
      s.agents.list.map((a) => [a.id, a.model]),
      [
        ["main", "scripted"],
        ["bare", ""],
        ["old", "tiny-1"],
      ],
    );
  });

  test("the reducer does not change its input", () => {
    const s0 = online();
    const frozen = JSON.stringify(s0);
    send(s0, "r1");
    assert.equal(JSON.stringify(s0), frozen);
  });
});

// --- §4 acks -----------------------------------------------------------------------------------------

describe("chat.send acks (§4)", () => {
  test("the user's message shows at once, with its own key, and the composer clears", () => {
    const s = reduce(send(online(), "r1", "hi there"), { type: "draft/set", key: KEY, text: "" });
    const [user] = byRole(s, "user");
    assert.equal(user.text, "hi there");
    assert.equal(user.runId, "r1");
    assert.equal(user.state, "sending");
    assert.equal(activity(s, KEY).pending, true);
  });

  test("started keeps the run pending (Stop shown) until its terminal event", () => {
    let s = ack(send(online(), "r1"), "r1", { status: "started" });
    assert.deepEqual(activity(s, KEY).activeRunIds, ["r1"]);
    assert.equal(byRole(s, "assistant")[0].state, "streaming");
    s = events(s, [chat("r1", 1, "status", { phase: "dispatching" }), delta("r1", 2, "echo:"), delta("r1", 3, "echo: hi")]);
    assert.equal(byRole(s, "assistant")[0].text, "echo: hi");
    assert.equal(activity(s, KEY).active, true);
    s = events(s, [chat("r1", 4, "final", { stopReason: "stop", message: { role: "assistant", content: [{ type: "text", text: "echo: hi" }] } })]);
    assert.equal(activity(s, KEY).active, false);
    assert.equal(byRole(s, "assistant")[0].state, "final");
    assert.equal(byRole(s, "user")[0].state, "final");
  });

  test("queued keeps pending state and shows the position", () => {
    let s = ack(send(online(), "r1"), "r1", { status: "started" });
    s = ack(send(s, "r2", "second"), "r2", { status: "queued", queuePosition: 1 });
    const queued = byRole(s, "user").find((u) => u.runId === "r2");
    assert.equal(queued.state, "queued");
    assert.equal(queued.position, 1);
    assert.equal(activity(s, KEY).queued, 1);
    assert.equal(byRole(s, "assistant").length, 1, "no reply placeholder for a queued message");
  });

  test("in_flight keeps pending state (queued or running)", () => {
    let s = ack(send(online(), "r1"), "r1", { status: "in_flight" });
    assert.equal(activity(s, KEY).active, true);
    s = ack(send(s, "r2"), "r2", { status: "in_flight", queuePosition: 2 });
    assert.equal(byRole(s, "user").find((u) => u.runId === "r2").state, "queued");
  });

  test("ok completes at once, without waiting for events", () => {
    const s = ack(send(online(), "r1"), "r1", { status: "ok", reply: "echo: hello", stopReason: "stop" });
    const act = activity(s, KEY);
    assert.equal(act.active, false);
    assert.equal(act.pending, false);
    const [reply] = byRole(s, "assistant");
    assert.equal(reply.state, "final");
    assert.equal(reply.text, "echo: hello");
  });

  test("error clears pending state, shows the reason and restores the draft", () => {
    const s = ack(send(online(), "r1", "oops [[fail:setup]]"), "r1", { status: "error", summary: "refused during setup" }, {
      ok: false,
      error: { code: "UNAVAILABLE", message: "refused during setup" },
    });
    const act = activity(s, KEY);
    assert.equal(act.active, false);
    assert.equal(act.pending, false);
    const [user] = byRole(s, "user");
    assert.equal(user.state, "error");
    assert.match(user.error, /refused during setup/);
    assert.equal(byRole(s, "assistant").length, 0, "no spinner, no reply placeholder");
    assert.equal(s.drafts[KEY], "oops [[fail:setup]]");
    assert.ok(s.effects.some((e) => e.type === "draft" && e.key === KEY));
  });

  test("timeout clears pending state and shows the failure", () => {
    const s = ack(send(online(), "r1", "slow"), "r1", { status: "timeout", stopReason: "rpc" });
    assert.equal(activity(s, KEY).active, false);
    const [user] = byRole(s, "user");
    assert.equal(user.state, "error");
    assert.match(user.error, /ended before it completed/);
    assert.equal(s.drafts[KEY], "slow");
  });

  test("a restored draft never overwrites what the user typed meanwhile", () => {
    let s = send(online(), "r1", "first");
    s = reduce(s, { type: "draft/set", key: KEY, text: "new words" });
    s = ack(s, "r1", { status: "error", summary: "nope" }, { ok: false, error: { code: "UNAVAILABLE", message: "nope" } });
    assert.equal(s.drafts[KEY], "new words");
  });

  test("a late non-terminal ack never revives a finished run", () => {
    let s = send(online(), "r1");
    s = events(s, [chat("r1", 1, "status", { phase: "dispatching" }), chat("r1", 2, "error", { errorMessage: "boom", errorKind: "dispatch" })]);
    s = ack(s, "r1", { status: "started" });
    assert.equal(activity(s, KEY).active, false);
    assert.equal(byRole(s, "assistant")[0].state, "error");
  });

  test("an unknown ack status does not leave a spinner", () => {
    const s = ack(send(online(), "r1"), "r1", { status: "mystery" });
    assert.equal(activity(s, KEY).active, false);
    assert.equal(activity(s, KEY).pending, false);
  });

  test("a rejected request (no ack payload) fails the message and restores the draft", () => {
    const s = reduce(send(online(), "r1", "x"), {
      type: "send/ack",
      key: KEY,
      runId: "r1",
      response: { ok: false, error: { code: "INVALID_REQUEST", message: "message must not be empty" } },
    });
    assert.equal(byRole(s, "user")[0].state, "error");
    assert.equal(s.drafts[KEY], "x");
  });

  test("queue-full is a visible failure; a retryable error sends again with the same key", () => {
    let s = reduce(send(online(), "r1", "x"), {
      type: "send/failed",
      key: KEY,
      runId: "r1",
      error: { code: "RATE_LIMITED", message: "full", retryable: true, details: { reason: "queue-full" } },
    });
    assert.equal(byRole(s, "user")[0].state, "error");
    s = send(online(), "r2", "y");
    s = reduce(s, { type: "send/sent", key: KEY, runId: "r2", gen: s.conn.gen });
    assert.deepEqual(outbox(s), []);
    s = reduce(s, { type: "send/failed", key: KEY, runId: "r2", error: { code: "RATE_LIMITED", message: "slow", retryable: true, retryAfterMs: 400 } });
    assert.deepEqual(s.effects, [{ type: "retry", afterMs: 400 }]);
    assert.deepEqual(outbox(s).map((r) => r.id), ["r2"]);
  });

  test("an inline command ack (/new) drops the local run and reloads", () => {
    const s = ack(send(online(), "c1", "/new"), "c1", { status: "ok", command: "/new", runId: "c1" });
    assert.equal(items(s).length, 0);
    assert.ok(s.effects.some((e) => e.type === "history"));
  });

  test("a command's answer comes as a chat final before its ack: shown once, then as history has it", () => {
    const answer = "Session agent:main:main (sessionId x)";
    const message = { role: "assistant", content: [{ type: "text", text: answer }], timestamp: 1, command: true };
    let s = send(online(), "c1", "/status");
    s = events(s, [chat("c1", 1, "final", { stopReason: "stop", message })]);
    assert.deepEqual(items(s).map((i) => [i.role, i.text, i.state]), [
      ["user", "/status", "final"],
      ["assistant", answer, "final"],
    ]);
    s = ack(s, "c1", { status: "ok", command: "/status", reply: answer, runId: "c1" });
    assert.ok(s.effects.some((e) => e.type === "history" && e.key === KEY));
    s = history(s, { messages: [msg(1, "user", "/status", "c1", { command: true }), msg(2, "assistant", answer, "c1", { command: true })] });
    assert.deepEqual(items(s).map((i) => [i.role, i.text]), [
      ["user", "/status"],
      ["assistant", answer],
    ]);
    assert.equal(activity(s, KEY).pending, false);
  });
});

// --- events --------------------------------------------------------------------------------------------

describe("chat events (§5)", () => {
  test("duplicates and events after the terminal are ignored", () => {
    let s = ack(send(online(), "r1"), "r1", { status: "started" });
    s = events(s, [delta("r1", 2, "echo: a b"), delta("r1", 1, "echo:"), chat("r1", 3, "aborted", { stopReason: "rpc" })]);
    assert.equal(byRole(s, "assistant")[0].text, "echo: a b");
    assert.equal(byRole(s, "assistant")[0].state, "aborted");
    s = events(s, [delta("r1", 4, "echo: a b c"), chat("r1", 5, "final", { stopReason: "stop" })]);
    assert.equal(byRole(s, "assistant")[0].state, "aborted");
    assert.equal(byRole(s, "assistant")[0].text, "echo: a b");
  });

  test("an error event before any output fails the run and gives the draft back", () => {
    let s = ack(send(online(), "r1", "[[fail:dispatch]]"), "r1", { status: "started" });
    s = events(s, [chat("r1", 1, "status", { phase: "dispatching" }), chat("r1", 2, "error", { errorMessage: "failed to dispatch", errorKind: "dispatch" })]);
    const [reply] = byRole(s, "assistant");
    assert.equal(reply.state, "error");
    assert.match(reply.error, /failed to dispatch/);
    assert.equal(activity(s, KEY).active, false);
    assert.equal(s.drafts[KEY], "[[fail:dispatch]]");
  });

  test("an admission failure whose event beats the ack shows the same as the ack", () => {
    let s = send(online(), "r1", "[[fail:setup]]");
    s = events(s, [chat("r1", 1, "error", { errorMessage: "refused", errorKind: "dispatch" })]);
    s = ack(s, "r1", { status: "error", summary: "refused" }, { ok: false, error: { code: "UNAVAILABLE", message: "refused" } });
    assert.equal(byRole(s, "user")[0].state, "error");
    assert.equal(byRole(s, "assistant").length, 0);
  });

  test("a run from another tab is shown and its user message fetched", () => {
    let s = online();
    s = events(s, [chat("t2", 1, "status", { phase: "dispatching" })]);
    assert.ok(s.effects.some((e) => e.type === "history" && e.key === KEY));
    s = events(s, [delta("t2", 2, "echo: from")]);
    assert.equal(activity(s, KEY).active, true);
    s = history(s, { messages: [msg(1, "user", "from the other tab", "t2")], inFlightRun: { runId: "t2", seq: 2, text: "echo: from" } });
    assert.deepEqual(items(s).map((i) => [i.role, i.state]), [["user", "final"], ["assistant", "streaming"]]);
    s = events(s, [chat("t2", 3, "final", { stopReason: "stop", message: { role: "assistant", content: [{ type: "text", text: "echo: from the other tab" }] } })]);
    assert.equal(activity(s, KEY).active, false, "Stop clears on the terminal event even for a run this tab did not start");
  });

  test("events of another session never touch this one", () => {
    let s = ack(send(online(), "r1"), "r1", { status: "started" });
    s = events(s, [chat("x1", 1, "final", { stopReason: "stop" }, OTHER), chat("r1", 5, "aborted", { stopReason: "rpc" }, OTHER)]);
    assert.equal(activity(s, KEY).active, true);
    assert.equal(byRole(s, "assistant")[0].state, "streaming");
  });
});

// --- rows -------------------------------------------------------------------------------------------------

describe("sessions.changed (§7)", () => {
  test("rows keep the newest version; a deleted row goes away and stays away", () => {
    let s = events(online(), [changed(row({ version: 3, status: "done" })), changed(row({ version: 2, status: "running", hasActiveRun: true }))]);
    assert.equal(sessionList(s)[0].status, "done");
    s = events(s, [changed({ ...row({ version: 4 }), deleted: true }, "delete")]);
    assert.equal(s.rows[KEY], undefined);
    s = events(s, [changed(row({ version: 4, status: "done" }), "resync")]);
    assert.equal(s.rows[KEY], undefined, "an older generation's row does not come back");
    s = events(s, [changed(row({ version: 1, createdAt: 5000 }), "create")]);
    assert.equal(s.rows[KEY].version, 1, "a re-created session with the same key does");
  });

  test("a stale running row does not bring Stop back after an ok ack", () => {
    let s = ack(send(online(), "r1"), "r1", { status: "ok", reply: "echo: hello" });
    s = events(s, [changed(row({ version: 2, status: "running", hasActiveRun: true, activeRunIds: ["r1"], lastRunId: "r1" }))]);
    assert.equal(activity(s, KEY).active, false);
  });

  test("a row that says the run ended settles it even if the terminal event was missed", () => {
    let s = ack(send(online(), "r1"), "r1", { status: "started" });
    s = events(s, [changed(row({ version: 5, status: "failed", lastRunId: "r1", lastRunError: "backend down" }), "run.failed")]);
    assert.equal(activity(s, KEY).active, false);
    const [reply] = byRole(s, "assistant");
    assert.equal(reply.state, "error");
    assert.match(reply.error, /backend down/);
  });

  test("the terminal event still refines a run the row settled", () => {
    let s = ack(send(online(), "r1"), "r1", { status: "started" });
    s = events(s, [changed(row({ version: 5, status: "done", lastRunId: "r1" }), "run.completed")]);
    s = events(s, [chat("r1", 3, "final", { stopReason: "stop", message: { role: "assistant", content: [{ type: "text", text: "echo: full" }] } })]);
    assert.equal(byRole(s, "assistant")[0].text, "echo: full");
  });

  test("a row that is older than the run only asks for history", () => {
    let s = ack(send(online(), "r1"), "r1", { status: "started" });
    s = events(s, [changed(row({ version: 5, status: "done", lastRunId: "r0" }), "run.completed")]);
    assert.equal(activity(s, KEY).active, true);
    assert.ok(s.effects.some((e) => e.type === "history"));
  });

  test("queue positions follow the row; a queued run that becomes active starts", () => {
    let s = ack(send(online(), "r1"), "r1", { status: "started" });
    s = ack(send(s, "r2"), "r2", { status: "queued", queuePosition: 2 });
    s = events(s, [changed(row({ version: 3, hasActiveRun: true, status: "running", activeRunIds: ["r1"], queuedRunIds: ["r2"], lastRunId: "r1" }))]);
    assert.equal(byRole(s, "user").find((u) => u.runId === "r2").position, 1);
    s = events(s, [chat("r1", 9, "final", { stopReason: "stop" }), changed(row({ version: 4, hasActiveRun: true, status: "running", activeRunIds: ["r2"], lastRunId: "r2" }))]);
    assert.equal(byRole(s, "user").find((u) => u.runId === "r2").state, "final");
    assert.deepEqual(activity(s, KEY).activeRunIds, ["r2"]);
  });

  test("sidebar statuses: running wins from hasActiveRun; queued count; last error", () => {
    const s = events(online(), [
      changed(row({ version: 2, status: "running", hasActiveRun: true, activeRunIds: ["a"], queuedRunIds: ["b", "c"], updatedAt: 10 })),
      changed(row({ key: OTHER, version: 2, status: "failed", lastRunError: "boom", updatedAt: 5 })),
    ]);
    const list = sessionList(s);
    assert.deepEqual(list.map((r) => [r.key, r.status, r.queued]), [[KEY, "running", 2], [OTHER, "failed", 0]]);
    assert.equal(list[1].error, "boom");
  });

  test("the open session and the default one are listed before they exist on the server", () => {
    const list = sessionList(online());
    assert.deepEqual(list.map((r) => [r.key, r.status, r.current]), [[KEY, "new", true]]);
    const s = events(reduce(online(), { type: "session/select", key: OTHER }), [changed(row({ key: "agent:main:x", version: 1 }))]);
    assert.deepEqual(sessionList(s).map((r) => [r.key, r.current]), [[OTHER, true], [KEY, false], ["agent:main:x", false]]);
  });

  test("deleting the open session moves to another one", () => {
    let s = events(online(), [changed(row({ version: 2, updatedAt: 10 })), changed(row({ key: OTHER, version: 2, updatedAt: 5 }))]);
    s = reduce(s, { type: "session/deleted", key: KEY });
    assert.equal(s.currentKey, OTHER);
    assert.ok(s.effects.some((e) => e.type === "history" && e.key === OTHER));
  });

  test("a list keeps rows that arrived after it was requested", () => {
    let s = online();
    const token = s.tick;
    s = events(s, [changed(row({ key: OTHER, version: 1 }), "create")]);
    s = reduce(s, { type: "list/loaded", token, payload: { sessions: [row({ version: 2 })], hasMore: false } });
    assert.deepEqual(Object.keys(s.rows).sort(), [KEY, OTHER]);
    s = reduce(s, { type: "list/loaded", token: s.tick, payload: { sessions: [row({ version: 2 })], hasMore: false } });
    assert.deepEqual(Object.keys(s.rows), [KEY]);
  });
});

// --- history and resync ----------------------------------------------------------------------------------

describe("history and resync (§6, §9)", () => {
  test("inFlightRun resumes a streaming reply, and later deltas continue it", () => {
    let s = history(online(), {
      messages: [msg(1, "user", "tell me", "r1")],
      inFlightRun: { runId: "r1", seq: 6, text: "echo: tell" },
      session: row({ version: 3, status: "running", hasActiveRun: true, activeRunIds: ["r1"], lastRunId: "r1" }),
    });
    assert.deepEqual(items(s).map((i) => [i.role, i.state, i.text]), [["user", "final", "tell me"], ["assistant", "streaming", "echo: tell"]]);
    assert.equal(activity(s, KEY).active, true);
    s = events(s, [delta("r1", 5, "echo:"), delta("r1", 7, "echo: tell me")]);
    assert.equal(byRole(s, "assistant")[0].text, "echo: tell me");
    s = events(s, [chat("r1", 8, "final", { stopReason: "stop", message: { role: "assistant", content: [{ type: "text", text: "echo: tell me" }] } })]);
    assert.equal(activity(s, KEY).active, false);
  });

  test("queuedRuns show as queued messages with their positions", () => {
    const s = history(online(), {
      messages: [msg(1, "user", "one", "r1")],
      inFlightRun: { runId: "r1", seq: 1, text: "" },
      queuedRuns: [{ runId: "r3", text: "three", position: 2 }, { runId: "r2", text: "two", position: 1 }],
    });
    assert.deepEqual(
      items(s).map((i) => [i.text, i.state, i.position ?? null]),
      [["one", "final", null], ["", "streaming", null], ["two", "queued", 1], ["three", "queued", 2]],
    );
  });

  test("a run that ended while disconnected is settled from history, not left spinning", () => {
    let s = ack(send(online(), "r1", "hi"), "r1", { status: "started" });
    s = reduce(s, { type: "conn/closed", retryInMs: 300 });
    s = run(s, [{ type: "conn/open" }, { type: "conn/ready", hello: {} }]);
    s = history(s, { messages: [msg(1, "user", "hi", "r1"), msg(2, "assistant", "echo: hi", "r1")] });
    assert.equal(activity(s, KEY).active, false);
    assert.deepEqual(items(s).map((i) => [i.role, i.state]), [["user", "final"], ["assistant", "final"]]);
  });

  test("history only settles runs the server had when it was read", () => {
    let s = online();
    const token = s.tick;
    s = ack(send(s, "r1"), "r1", { status: "started" });
    s = history(s, { messages: [] }, KEY, token);
    assert.equal(activity(s, KEY).active, true);
  });

  test("a failed run's reason survives a reload through the row", () => {
    const s = history(online(), {
      messages: [msg(1, "user", "[[fail:dispatch]]", "r1")],
      session: row({ version: 4, status: "failed", lastRunId: "r1", lastRunError: "failed to dispatch" }),
    });
    const [reply] = byRole(s, "assistant");
    assert.equal(reply.state, "error");
    assert.match(reply.error, /failed to dispatch/);
  });

  test("aborted history messages are marked", () => {
    const s = history(online(), { messages: [msg(1, "user", "x", "r1"), msg(2, "assistant", "echo: part", "r1", { aborted: true })] });
    assert.equal(byRole(s, "assistant")[0].state, "aborted");
  });

  test("a history prompt keeps the files it was sent with (a reload shows their chips)", () => {
    const file = { fileId: "file-1", mimeType: "image/png", fileName: "dot.png", size: 68 };
    const s = history(online(), { messages: [msg(1, "user", "look", "r1", { attachments: [file, { junk: true }] }), msg(2, "assistant", "echo: look", "r1"), msg(3, "user", "plain", "r3")] });
    const [withFile, plain] = byRole(s, "user");
    assert.deepEqual(withFile.attachments, [file]);
    assert.deepEqual(plain.attachments, []);
  });

  test("older pages are prepended and kept over a refresh", () => {
    let s = history(online(), { messages: [msg(10, "user", "ten", "r10"), msg(11, "assistant", "echo: ten", "r10")], hasMore: true });
    s = reduce(s, { type: "history/loaded", key: KEY, token: 0, older: true, payload: { sessionId: GEN, messages: [msg(8, "user", "eight", "r8"), msg(9, "assistant", "echo: eight", "r8")], hasMore: false } });
    assert.deepEqual(items(s).map((i) => i.text), ["eight", "echo: eight", "ten", "echo: ten"]);
    s = history(s, { messages: [msg(10, "user", "ten", "r10"), msg(11, "assistant", "echo: ten", "r10"), msg(12, "user", "twelve", "r12")], hasMore: true });
    assert.deepEqual(items(s).map((i) => i.text), ["eight", "echo: eight", "ten", "echo: ten", "twelve"]);
    assert.equal(s.convs[KEY].hasMore, false);
  });

  test("a reset elsewhere (new sessionId) reloads and hides the old generation", () => {
    let s = history(online(), { messages: [msg(1, "user", "old", "r1")] });
    s = events(s, [changed(row({ version: 2 })), changed(row({ version: 3, sessionId: "22222222-2222-2222-2222-222222222222" }), "reset")]);
    assert.ok(s.effects.some((e) => e.type === "history"));
    s = reduce(s, { type: "history/loaded", key: KEY, token: s.tick, payload: { sessionId: "22222222-2222-2222-2222-222222222222", messages: [], hasMore: false } });
    assert.equal(items(s).length, 0);
  });

  test("a seq gap asks for a resync; a fresh connection starts counting again", () => {
    let s = online();
    s = reduce(s, { type: "event", frame: { type: "event", event: "tick", payload: {}, seq: 2 } });
    assert.deepEqual(s.effects, []);
    s = reduce(s, { type: "event", frame: { type: "event", event: "tick", payload: {}, seq: 5 } });
    assert.deepEqual(s.effects.map((e) => e.type).sort(), ["approvals", "history", "list"]);
    s = reduce(s, { type: "conn/open" });
    s = reduce(s, { type: "event", frame: { type: "event", event: "connect.challenge", payload: {}, seq: 1 } });
    assert.deepEqual(s.effects, []);
  });

  test("a shutdown notice goes away once the page is connected again", () => {
    let s = events(online(), [["shutdown", { reason: "server shutting down" }]]);
    assert.match(s.notice.text, /restarting/);
    s = run(s, [{ type: "conn/closed", retryInMs: 300 }, { type: "conn/open" }, { type: "conn/ready", hello: {} }]);
    assert.equal(s.notice, null);
  });

  test("connecting resyncs: list, open conversation, pending approvals, then the outbox", () => {
    const s = online();
    assert.deepEqual(s.effects.map((e) => e.type), ["list", "history", "approvals", "flush"]);
  });
});

// --- outbox ---------------------------------------------------------------------------------------------------

describe("sending while disconnected", () => {
  test("a send made offline waits, then goes out once per connection with the same key", () => {
    let s = reduce(online(), { type: "conn/closed", retryInMs: 500 });
    s = send(s, "r1", "while offline");
    assert.deepEqual(outbox(s), [], "nothing goes out while offline");
    assert.equal(byRole(s, "user")[0].state, "sending");
    s = run(s, [{ type: "conn/open" }, { type: "conn/ready", hello: {} }]);
    const due = outbox(s);
    assert.deepEqual(due.map((r) => [r.id, r.userText]), [["r1", "while offline"]]);
    s = reduce(s, { type: "send/sent", key: KEY, runId: "r1", gen: s.conn.gen });
    assert.deepEqual(outbox(s), [], "not twice on the same connection");
    // The socket drops before the ack: the same key goes out again on the next connection.
    s = run(s, [{ type: "conn/closed", retryInMs: 300 }, { type: "conn/open" }, { type: "conn/ready", hello: {} }]);
    assert.deepEqual(outbox(s).map((r) => r.id), ["r1"]);
    s = reduce(s, { type: "send/sent", key: KEY, runId: "r1", gen: s.conn.gen });
    s = ack(s, "r1", { status: "in_flight" });
    assert.deepEqual(outbox(s), []);
    assert.equal(activity(s, KEY).active, true);
  });

  test("sends go out in the order they were made", () => {
    let s = reduce(online(), { type: "conn/closed", retryInMs: 500 });
    s = send(send(s, "a", "1"), "b", "2");
    s = run(s, [{ type: "conn/open" }, { type: "conn/ready", hello: {} }]);
    assert.deepEqual(outbox(s).map((r) => r.id), ["a", "b"]);
  });
});

// --- resends after a dropped socket ------------------------------------------------------------------

/** The socket drops after `runId` went out, before its ack; the page connects again. */
function dropAndReconnect(state, runId, key = KEY) {
  let s = reduce(state, { type: "send/sent", key, runId, gen: state.conn.gen });
  s = reduce(s, { type: "conn/closed", retryInMs: 300 });
  s = reduce(s, { type: "send/unsent", key, runId });
  return run(s, [{ type: "conn/open" }, { type: "conn/ready", hello: {} }]);
}

describe("resends after a dropped socket", () => {
  test("a terminal ack for a resent message the transcript already holds gives no draft back", () => {
    let s = dropAndReconnect(send(online(), "R", "hello there"), "R");
    // History (read first) shows that R ran, streamed and was stopped from another tab meanwhile.
    s = history(s, {
      messages: [msg(1, "user", "hello there", "R"), msg(2, "assistant", "echo: hel", "R", { aborted: true })],
      session: row({ version: 9, status: "killed", lastRunId: "R", abortedLastRun: true }),
    });
    s = reduce(s, { type: "send/sent", key: KEY, runId: "R", gen: s.conn.gen });
    s = ack(s, "R", { status: "timeout", stopReason: "rpc" });
    assert.equal(s.drafts[KEY] || "", "", "the message was delivered: nothing goes back to the composer");
    assert.ok(!s.effects.some((e) => e.type === "draft"));
    assert.equal(s.runs[`${KEY}|R`].rejected, false);
    assert.deepEqual(
      items(s).map((i) => [i.role, i.state, i.text]),
      [["user", "final", "hello there"], ["assistant", "aborted", "echo: hel"]],
    );
    assert.equal(byRole(s, "assistant")[0].meta, "Stopped");
    assert.ok(s.effects.some((e) => e.type === "history" && e.key === KEY), "the terminal ack is followed by a history refresh");
    assert.equal(activity(s, KEY).active, false);
  });

  test("an error ack for a message the transcript holds fails the reply, not the send", () => {
    let s = dropAndReconnect(send(online(), "R", "hi"), "R");
    s = history(s, { messages: [msg(1, "user", "hi", "R")] });
    s = ack(s, "R", { status: "error", summary: "backend down" }, { ok: false, error: { code: "UNAVAILABLE", message: "backend down" } });
    assert.equal(s.drafts[KEY] || "", "");
    assert.deepEqual(items(s).map((i) => [i.role, i.state]), [["user", "final"], ["assistant", "error"]]);
    assert.match(byRole(s, "assistant")[0].error, /backend down/);
  });

  test("every terminal timeout or error ack asks for a history refresh", () => {
    const t = ack(send(online(), "r1", "slow"), "r1", { status: "timeout", stopReason: "timeout" });
    assert.ok(t.effects.some((e) => e.type === "history" && e.key === KEY));
    let e = send(online(), "r2", "x");
    e = events(e, [chat("r2", 1, "status", { phase: "dispatching" }), chat("r2", 2, "error", { errorMessage: "boom", errorKind: "backend" })]);
    e = ack(e, "r2", { status: "error", summary: "boom" }, { ok: false, error: { code: "UNAVAILABLE", message: "boom" } });
    assert.ok(e.effects.some((x) => x.type === "history" && x.key === KEY), "also when the terminal event came first");
  });

  test("an inline command whose ack was lost is not sent again; it shows as unconfirmed", () => {
    for (const text of ["/stop", " /new ", "/reset"]) {
      let s = dropAndReconnect(send(online(), "c1", text), "c1");
      assert.deepEqual(outbox(s), [], `${JSON.stringify(text)} is not resent after the reconnect`);
      const [user] = byRole(s, "user");
      assert.equal(user.state, "error");
      assert.equal(user.unconfirmed, true);
      assert.match(user.error, new RegExp(`${text.trim()} was confirmed|not sent again`));
      assert.equal(activity(s, KEY).pending, false);
      assert.equal(s.drafts[KEY] || "", "", "not put back in the composer: it may have been carried out");
    }
  });

  test("an inline command made while offline still goes out once", () => {
    let s = reduce(online(), { type: "conn/closed", retryInMs: 500 });
    s = send(s, "c1", "/stop");
    s = run(s, [{ type: "conn/open" }, { type: "conn/ready", hello: {} }]);
    assert.deepEqual(outbox(s).map((r) => r.id), ["c1"]);
    s = reduce(s, { type: "send/sent", key: KEY, runId: "c1", gen: s.conn.gen });
    assert.deepEqual(outbox(s), []);
    s = ack(s, "c1", { status: "ok", command: "/stop", aborted: false, runIds: [] });
    assert.equal(items(s).length, 0);
  });

  test("a message that only looks like a command is resent as usual", () => {
    const s = dropAndReconnect(send(online(), "r1", "/stop now"), "r1");
    assert.deepEqual(outbox(s).map((r) => r.id), ["r1"]);
  });
});
