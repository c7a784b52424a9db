// Steering on the page (static/chat/steering.js and its use in sends, runs, history and the
// conversation): a message typed while a run works goes into it, and the transcript shows the reply
// so far, the steer, then the rest, live and after a reload. Run by `node --test tests/js/`.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { conversation, editTarget } from "../../static/chat/conversation.js";
import { activity } from "../../static/chat/runs.js";
import { outbox } from "../../static/chat/sends.js";
import { initialState, reduce } from "../../static/chat/state.js";
import { restOf } from "../../static/chat/steering.js";
import { GEN, KEY, run } from "./support.mjs";

function online() {
  return run(initialState(), [
    { type: "conn/open" },
    { type: "conn/ready", hello: { auth: { user: "alice" }, snapshot: { sessionDefaults: { mainSessionKey: KEY } } } },
  ]);
}

function events(state, list) {
  let s = state;
  for (const [name, payload] of list) {
    s = reduce(s, { type: "event", frame: { type: "event", event: name, payload, seq: s.conn.lastSeq + 1 } });
  }
  return s;
}

const send = (s, runId, text, extra = {}) => reduce(s, { type: "send/request", key: KEY, runId, text, ...extra });

function ack(s, runId, payload) {
  const response = { type: "res", id: "x", ok: true, payload: { runId, sessionKey: KEY, sessionId: GEN, ...payload } };
  return reduce(s, { type: "send/ack", key: KEY, runId, response });
}

const chat = (runId, seq, state, extra = {}) => ["chat", { runId, sessionKey: KEY, sessionId: GEN, seq, state, ...extra }];
const content = (text) => ({ role: "assistant", content: [{ type: "text", text }] });
const delta = (runId, seq, text) => chat(runId, seq, "delta", { deltaText: "", message: content(text) });
const agent = (runId, data) => ["agent", { runId, sessionKey: KEY, sessionId: GEN, agentId: "llm", stream: "tool", data, seq: 1, ts: 1 }];

function history(s, payload) {
  return reduce(s, {
    type: "history/loaded",
    key: KEY,
    token: s.tick,
    payload: { sessionKey: KEY, sessionId: GEN, messages: [], hasMore: false, session: null, queuedRuns: [], ...payload },
  });
}

const user = (id, text, runId) => ({ id: String(id), role: "user", content: [{ type: "text", text }], runId, timestamp: 1 });
const reply = (id, text, runId, calls = []) => ({
  id: String(id),
  role: "assistant",
  content: [{ type: "text", text }, ...calls.map((c) => ({ type: "toolCall", id: c, name: "t__count", arguments: {} }))],
  runId,
  timestamp: 1,
});
const toolResult = (callId, runId, status) => ({ id: callId, role: "toolResult", toolCallId: callId, toolName: "t__count", content: [{ type: "text", text: "1" }], runId, status, isError: status !== "succeeded", timestamp: 1 });

/** What the page shows, in order: role, text and state of each item (tool cards by call id and state). */
const shown = (s) =>
  conversation(s, KEY).map((i) => (i.role === "tool" ? `tool ${i.toolCallId} ${i.view.label}` : `${i.role} ${JSON.stringify(i.text)} ${i.state}`));

/** r1 is working: sent, acked `started`, streaming "Counting." with a call under way. */
function working() {
  let s = send(online(), "r1", "count twice");
  s = ack(s, "r1", { status: "started" });
  s = events(s, [
    chat("r1", 1, "status", { phase: "started" }),
    delta("r1", 2, "Counting."),
    agent("r1", { phase: "start", name: "t__count", toolCallId: "call_a", args: {} }),
  ]);
  return s;
}

const chatSends = (s) => outbox(s).map((r) => [r.id, r.queueMode]);

describe("sending while a run works", () => {
  test("a message typed while the run works goes out as a steer; on an idle session, as any send", () => {
    let s = send(online(), "r0", "hi");
    assert.deepEqual(chatSends(s), [["r0", null]]);
    s = working();
    s = send(s, "s1", "stop counting");
    assert.deepEqual(chatSends(s), [["s1", "steer"]]);
  });

  test("asked to queue (Alt+Enter), or an inline command, it is not a steer", () => {
    let s = send(working(), "q1", "after that", { queue: true });
    s = send(s, "c1", "/status");
    assert.deepEqual(chatSends(s), [["q1", null], ["c1", null]]);
  });

  test("a send restored from storage keeps the mode it first went out with", () => {
    const s = send(online(), "s1", "stop counting", { restored: true, queueMode: "steer" });
    assert.deepEqual(chatSends(s), [["s1", "steer"]]);
  });
});

describe("the steer's ack and events", () => {
  test("acked steered: it waits to be read, after the reply so far, and is not counted as queued", () => {
    let s = send(working(), "s1", "stop counting");
    s = ack(s, "s1", { status: "started", runId: "r1", steered: true, steerRunId: "s1" });
    assert.equal(s.runs[`${KEY}|s1`].phase, "steering");
    assert.equal(s.runs[`${KEY}|s1`].steeredInto, "r1");
    assert.deepEqual(shown(s), [
      'user "count twice" final',
      "tool call_a Running…",
      'assistant "Counting." streaming',
      'user "stop counting" steering',
    ]);
    assert.equal(activity(s, KEY).queued, 0);
    // the row lists it among the queued runs (it is in the server's queue): still not "queued"
    const row = { key: KEY, sessionId: GEN, agentId: "llm", status: "running", hasActiveRun: true, activeRunIds: ["r1"], queuedRunIds: ["s1"], version: 5, createdAt: 1, updatedAt: 2 };
    s = events(s, [["sessions.changed", { sessionKey: KEY, reason: "steer.queued", ts: 2, session: row }]]);
    assert.equal(activity(s, KEY).queued, 0);
    assert.equal(shown(s).at(-1), 'user "stop counting" steering');
    assert.equal(editTarget(s, KEY), null); // nothing to edit while it waits
  });

  test("its pending status event before the ack changes nothing of that", () => {
    let s = send(working(), "s1", "stop counting");
    s = events(s, [chat("s1", 1, "status", { phase: "queued", steer: "pending" })]);
    s = ack(s, "s1", { status: "started", runId: "r1", steered: true, steerRunId: "s1" });
    assert.equal(s.runs[`${KEY}|s1`].phase, "steering");
  });

  test("another tab's steer, first seen by its pending event, shows waiting too", () => {
    const s = events(working(), [chat("x1", 1, "status", { phase: "queued", steer: "pending" })]);
    assert.equal(s.runs[`${KEY}|x1`].phase, "steering");
    assert.equal(activity(s, KEY).queued, 0);
  });

  test("acked queued (the run cannot take it): shown queued, as any follow-up", () => {
    let s = send(working(), "s1", "stop counting");
    s = ack(s, "s1", { status: "queued", runId: "s1", queuePosition: 1 });
    assert.equal(shown(s).at(-1), 'user "stop counting" queued');
  });

  test("the run ended before taking it: the follow-up event moves it to queued", () => {
    let s = send(working(), "s1", "stop counting");
    s = ack(s, "s1", { status: "started", runId: "r1", steered: true, steerRunId: "s1" });
    s = events(s, [chat("r1", 3, "final", { message: content("Counting.") }), chat("s1", 2, "status", { phase: "queued", steer: "followup" })]);
    assert.equal(shown(s).at(-1), 'user "stop counting" queued');
    assert.equal(activity(s, KEY).queued, 1);
  });
});

describe("a steer the run took", () => {
  function taken() {
    let s = send(working(), "s1", "stop counting");
    s = ack(s, "s1", { status: "started", runId: "r1", steered: true, steerRunId: "s1" });
    s = events(s, [
      agent("r1", { phase: "result", name: "t__count", toolCallId: "call_a", status: "succeeded", isError: false, result: { content: [{ type: "text", text: "1" }] } }),
      agent("r1", { phase: "result", name: "t__count", toolCallId: "call_b", status: "skipped", isError: true, errorKind: "skipped", result: { content: [{ type: "text", text: "Skipped to process an incoming message." }] } }),
      chat("s1", 2, "aborted", { stopReason: "steered" }),
    ]);
    return s;
  }

  test("its taken event asks for the transcript and shows no stopped reply of its own", () => {
    const s = taken();
    assert.ok(s.effects.some((e) => e.type === "history" && e.key === KEY));
    const items = conversation(s, KEY);
    assert.equal(items.filter((i) => i.runId === "s1").length, 1); // only the message, no empty "Stopped"
    assert.equal(items.find((i) => i.runId === "s1").state, "final");
    assert.ok(shown(s).includes("tool call_b Skipped"));
  });

  const before = [user(1, "count twice", "r1"), reply(2, "Counting.", "r1", ["call_a", "call_b"]), toolResult("call_a", "r1", "succeeded"), toolResult("call_b", "r1", "skipped"), user(3, "stop counting", "s1")];
  const splitView = (rest, state) => [
    'user "count twice" final',
    "tool call_a Done",
    "tool call_b Skipped",
    'assistant "Counting." final',
    'user "stop counting" final',
    `assistant ${JSON.stringify(rest)} ${state}`,
  ];

  test("the live reply splits: the part before, the steer, the rest streaming after", () => {
    let s = history(taken(), { messages: before, inFlightRun: { runId: "r1", seq: 3, text: "" } });
    assert.deepEqual(shown(s), splitView("", "streaming"));
    s = events(s, [delta("r1", 4, "Counting.\n\nChanged")]); // events carry the whole reply
    assert.deepEqual(shown(s), splitView("Changed", "streaming"));
    s = events(s, [chat("r1", 5, "final", { stopReason: "stop", message: content("Counting.\n\nChanged course.") })]);
    assert.deepEqual(shown(s), splitView("Changed course.", "final"));
    s = history(s, { messages: [...before, reply(4, "Changed course.", "r1")] });
    assert.deepEqual(shown(s), splitView("Changed course.", "final"));
  });

  test("after a reload, history alone shows the same order, with no stopped bubble for the steer", () => {
    const tools = [
      agent("r1", { phase: "result", name: "t__count", toolCallId: "call_a", status: "succeeded", isError: false, result: { content: [{ type: "text", text: "1" }] } }),
    ];
    let s = history(online(), { messages: [...before, reply(4, "Changed course.", "r1")] });
    assert.deepEqual(shown(s), splitView("Changed course.", "final"));
    s = events(s, tools); // a late event of an ended call changes no order
    assert.deepEqual(shown(s), splitView("Changed course.", "final"));
  });

  test("a reload while the run answers the steer: the in-flight text is only the rest", () => {
    let s = history(online(), { messages: before, inFlightRun: { runId: "r1", seq: 6, text: "Chan" } });
    assert.deepEqual(shown(s), splitView("Chan", "streaming"));
    s = events(s, [delta("r1", 7, "Counting.\n\nChanged")]);
    assert.deepEqual(shown(s), splitView("Changed", "streaming"));
  });

  test("two steers in a row sit together, the rest after both; a later run's message is no steer", () => {
    const msgs = [user(1, "go", "r1"), reply(2, "A", "r1", ["c1"]), toolResult("c1", "r1", "succeeded"), user(3, "one", "s1"), user(4, "two", "s2"), reply(5, "B", "r1"), user(6, "next", "r2"), reply(7, "C", "r2")];
    const s = history(online(), { messages: msgs });
    assert.deepEqual(
      conversation(s, KEY).filter((i) => i.role !== "tool").map((i) => `${i.role}:${i.text}`),
      ["user:go", "assistant:A", "user:one", "user:two", "assistant:B", "user:next", "assistant:C"],
    );
  });
});

test("restOf: what the parts in the transcript do not hold yet", () => {
  assert.equal(restOf("A\n\nB", ["A"]), "B");
  assert.equal(restOf("B", ["A"]), "B"); // history's in-flight text is already only the rest
  assert.equal(restOf("A\n\nB\n\nC", ["A", "B"]), "C");
  assert.equal(restOf("", ["A"]), "");
});
