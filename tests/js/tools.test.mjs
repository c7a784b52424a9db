// Unit tests of tool calls and approvals on the chat page (TOOLS.md §13): the state in
// static/chat/tools.js (through the reducer in state.js), and the card's DOM (toolcard.js) against a
// small fake document.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { conversation } from "../../static/chat/conversation.js";
import { sessionList } from "../../static/chat/sessions.js";
import { initialState, reduce } from "../../static/chat/state.js";
import { needsApproval, pendingApprovals, resultText } from "../../static/chat/tools.js";
import { formatArgs, formatProgress, formatTimeLeft, toolCardView } from "../../static/chat/toolview.js";
import { createToolCard, updateCountdown, updateToolCard } from "../../static/chat/toolcard.js";
import { GEN, KEY, OTHER, run } from "./support.mjs";

const XSS = '<img src=x onerror="alert(1)"><script>alert(2)</script>';

// --- helpers ------------------------------------------------------------------------------------


function online() {
  return run(initialState(), [
    { type: "conn/open" },
    { type: "conn/ready", hello: { auth: { user: "alice" }, snapshot: { sessionDefaults: { mainSessionKey: KEY } } } },
  ]);
}

/** Event frames with consecutive connection seq numbers; `at` is the page's clock on arrival. */
function events(state, list, at = 1_000_000) {
  let s = state;
  for (const [name, payload] of list) {
    s = reduce(s, { type: "event", frame: { type: "event", event: name, payload, seq: s.conn.lastSeq + 1 }, at });
  }
  return s;
}

function agent(runId, stream, data, key = KEY) {
  return ["agent", { runId, sessionKey: key, sessionId: GEN, agentId: "main", stream, data, seq: 1, ts: 1 }];
}
const start = (runId, id, args = { expr: "1+1" }, key = KEY) => agent(runId, "tool", { phase: "start", name: "calc.eval", toolCallId: id, args }, key);
const update = (runId, id, partialResult) => agent(runId, "tool", { phase: "update", name: "calc.eval", toolCallId: id, partialResult });
const result = (runId, id, text, status = "succeeded", key = KEY) =>
  agent(runId, "tool", { phase: "result", name: "calc.eval", toolCallId: id, isError: status === "failed", status, result: { content: [{ type: "text", text }] } }, key);
const chat = (runId, seq, state, extra = {}) => ["chat", { runId, sessionKey: KEY, sessionId: GEN, seq, state, ...extra }];

function approvalPayload(id, toolCallId, runId, { createdAtMs = 5_000_000, expiresAtMs = 5_120_000, key = KEY } = {}) {
  return {
    id,
    request: {
      title: "Write a note?",
      description: "notes.write wants to write 'hi'",
      severity: "warning",
      toolName: "notes.write",
      toolCallId,
      mcpTool: { server: "notes", tool: "write" },
      allowedDecisions: ["allow-once", "deny"],
      agentId: "main",
      sessionKey: key,
      runId,
    },
    createdAtMs,
    expiresAtMs,
  };
}

/** A run of this page that started (sent, acked), so its tool events have a run to belong to. */
function started(s, runId, text = "hello") {
  s = reduce(s, { type: "send/request", key: KEY, runId, text });
  const response = { type: "res", id: "x", ok: true, payload: { runId, status: "started", sessionKey: KEY, sessionId: GEN } };
  return reduce(s, { type: "send/ack", key: KEY, runId, response });
}

function history(state, payload, key = KEY, token = state.tick) {
  return reduce(state, {
    type: "history/loaded",
    key,
    token,
    payload: { sessionKey: key, sessionId: GEN, messages: [], hasMore: false, session: null, queuedRuns: [], ...payload },
  });
}

const text = (t) => ({ type: "text", text: t });
const cards = (s, key = KEY) => conversation(s, key).filter((i) => i.role === "tool");
const card = (s, id, key = KEY) => cards(s, key).find((i) => i.toolCallId === id);

// --- tool events ---------------------------------------------------------------------------------

describe("tool events (agent stream tool)", () => {
  test("start then result: a card that spins while running, then shows its outcome", () => {
    let s = started(online(), "r1");
    s = events(s, [start("r1", "tc1", { expr: "6*7" })]);
    let c = card(s, "tc1");
    assert.equal(c.view.state, "running");
    assert.equal(c.view.spinning, true);
    assert.equal(c.view.name, "calc.eval");
    assert.equal(c.view.args.text, JSON.stringify({ expr: "6*7" }, null, 2));
    assert.equal(c.view.result, null);
    s = events(s, [result("r1", "tc1", "42")]);
    c = card(s, "tc1");
    assert.equal(c.view.state, "succeeded");
    assert.equal(c.view.spinning, false);
    assert.deepEqual(c.view.result, { text: "42", isError: false });
    assert.equal(s.tools.tc1.runId, "r1");
  });

  test("the reducer does not change its input on tool and approval frames", () => {
    const steps = [
      [start("r1", "tc1")],
      [update("r1", "tc1", { progress: 1 })],
      [agent("r1", "approval", { phase: "requested", approvalId: "ap1", toolCallId: "tc1", status: "pending" })],
      [["plugin.approval.requested", approvalPayload("ap1", "tc1", "r1")]],
      [["plugin.approval.resolved", { id: "ap1", decision: "allow-once", ts: 1 }]],
      [result("r1", "tc1", "ok")],
      [chat("r1", 1, "final", {})],
    ];
    let s = started(online(), "r1");
    for (const list of steps) {
      const frozen = JSON.stringify(s);
      const next = events(s, list);
      assert.equal(JSON.stringify(s), frozen);
      s = next;
    }
    const frozen = JSON.stringify(s);
    reduce(s, { type: "approvals/listed", token: s.tick, at: 1, payload: [] });
    history(s, { messages: [{ id: "1", role: "toolResult", toolCallId: "tc1", content: [text("x")], status: "failed", runId: "r1" }] });
    assert.equal(JSON.stringify(s), frozen);
  });

  test("the run's cards come before its reply, in call order", () => {
    let s = started(online(), "r1");
    s = events(s, [start("r1", "tc1"), result("r1", "tc1", "2"), start("r1", "tc2"), chat("r1", 1, "delta", { message: { role: "assistant", content: [text("two")] } })]);
    assert.deepEqual(
      conversation(s, KEY).map((i) => i.id),
      ["u:r1", "t:tc1", "t:tc2", "a:r1"],
    );
  });

  test("a result without a start creates the card from it", () => {
    let s = started(online(), "r1");
    s = events(s, [result("r1", "tc9", "done late", "failed")]);
    const c = card(s, "tc9");
    assert.equal(c.view.state, "failed");
    assert.equal(c.view.result.isError, true);
    assert.equal(c.view.args.known, false, "no arguments known: none shown");
    assert.equal(c.view.name, "calc.eval");
  });

  test("a second result, or a start after the result, never re-opens a finished call", () => {
    let s = started(online(), "r1");
    s = events(s, [result("r1", "tc1", "first"), result("r1", "tc1", "second", "failed"), start("r1", "tc1", { expr: "late" }), update("r1", "tc1", { progress: 1 })]);
    const call = s.tools.tc1;
    assert.equal(call.status, "succeeded");
    assert.equal(call.result, "first");
    assert.equal(call.progress, null);
    assert.deepEqual(call.args, { expr: "late" }, "what it lacked (its arguments) is filled in");
    assert.equal(cards(s).length, 1);
  });

  test("update shows progress while running", () => {
    let s = started(online(), "r1");
    s = events(s, [start("r1", "tc1"), update("r1", "tc1", { progress: 3, total: 10, message: "fetching" })]);
    assert.deepEqual(card(s, "tc1").view.progress, { value: 3, max: 10, text: "3 / 10 · fetching" });
    s = events(s, [update("r1", "tc1", { progress: 4 })]);
    assert.equal(card(s, "tc1").view.progress.text, "4");
    s = events(s, [result("r1", "tc1", "ok")]);
    assert.equal(card(s, "tc1").view.progress, null);
  });

  test("arguments: pretty JSON, or the model's invalid text as it came", () => {
    assert.deepEqual(formatArgs({ a: [1] }), { text: '{\n  "a": [\n    1\n  ]\n}', valid: true, known: true });
    assert.deepEqual(formatArgs('{"a":1}'), { text: '{\n  "a": 1\n}', valid: true, known: true });
    assert.deepEqual(formatArgs('{"a":'), { text: '{"a":', valid: false, known: true });
    assert.equal(formatArgs(undefined).known, false);
    let s = started(online(), "r1");
    s = events(s, [start("r1", "tc1", '{"broken"')]);
    assert.equal(card(s, "tc1").view.args.valid, false);
  });

  test("cards show only in their session's conversation (and generation)", () => {
    let s = started(online(), "r1");
    s = events(s, [start("r9", "tcx", {}, OTHER), start("r1", "tc1")]);
    assert.deepEqual(cards(s).map((c) => c.toolCallId), ["tc1"]);
    assert.equal(s.tools.tcx.key, OTHER);
    s = history(s, { sessionId: "22222222-2222-2222-2222-222222222222" }); // reset elsewhere: a new generation
    assert.deepEqual(cards(s), []);
  });

  test("a call of a run this page does not know (another tab) reloads the open conversation", () => {
    let s = online();
    s = events(s, [start("r-other", "tc1")]);
    assert.deepEqual(s.effects, [{ type: "history", key: KEY }]);
    assert.equal(card(s, "tc1").view.state, "running", "shown at the end until history places it");
    s = events(s, [start("r9", "tc2", {}, OTHER)]);
    assert.deepEqual(s.effects, [], "not for another session");
  });

  test("status labels: every terminal state is said plainly; unknown says it was not run again", () => {
    for (const status of ["succeeded", "failed", "denied", "expired", "cancelled", "unknown"]) {
      let s = started(online(), "r1");
      s = events(s, [start("r1", "tc1"), result("r1", "tc1", "x", status)]);
      const view = card(s, "tc1").view;
      assert.equal(view.state, status);
      assert.equal(view.spinning, false);
      assert.ok(view.label && !/…/.test(view.label), `${status}: ${view.label}`);
    }
    assert.match(toolCardView({ id: "x", status: "unknown", runEnded: false, args: undefined }).label, /not known|unknown/i);
    assert.match(toolCardView({ id: "x", status: "unknown", runEnded: false, args: undefined }).label, /not run again/);
  });

  test("a call handed to the API client says so, live and from history, with no result of its own", () => {
    let s = started(online(), "r1");
    s = events(s, [start("r1", "tc1", { city: "Oslo" }), result("r1", "tc1", "", "client")]);
    const view = card(s, "tc1").view;
    assert.equal(view.state, "client");
    assert.equal(view.label, "Handed to the API client");
    assert.equal(view.spinning, false);
    assert.equal(view.result, null);
    const row = createToolCard(fakeDocument);
    updateToolCard(row, view, { now: 0 });
    assert.equal(byTestId(row, "tool-card").getAttribute("data-state"), "client");
    assert.equal(byTestId(row, "tool-result").hidden, true);
    const asked = { id: "2", role: "assistant", content: [{ type: "toolCall", id: "tc2", name: "get_weather", arguments: {} }], runId: "r2" };
    const handed = { id: "tc2", role: "toolResult", toolCallId: "tc2", toolName: "get_weather", content: [text("")], isError: false, status: "client", runId: "r2", timestamp: 1 };
    s = history(online(), { messages: [asked, handed] });
    assert.equal(card(s, "tc2").view.label, "Handed to the API client");
  });

  test("a failed call says why (its errorKind), from the event, history or the open run's list", () => {
    const failed = (id, errorKind) =>
      agent("r1", "tool", { phase: "result", name: "calc.eval", toolCallId: id, isError: true, status: "failed", errorKind, result: { content: [text("x")] } });
    let s = started(online(), "r1");
    s = events(s, [start("r1", "tc1"), failed("tc1", "tool_timeout"), start("r1", "tc2"), failed("tc2", "some_new_kind")]);
    assert.equal(card(s, "tc1").view.label, "Failed: the tool timed out");
    assert.equal(card(s, "tc1").view.errorKind, "tool_timeout");
    assert.equal(card(s, "tc2").view.label, "Failed: some_new_kind", "a kind the page does not know, as it came");
    const row = createToolCard(fakeDocument);
    updateToolCard(row, card(s, "tc1").view, { now: 0 });
    assert.equal(byTestId(row, "tool-card").getAttribute("data-error-kind"), "tool_timeout");
    const toolResult = { id: "3", role: "toolResult", toolCallId: "tc3", toolName: "calc.eval", content: [text("bad")], isError: true, status: "failed", errorKind: "bad_arguments", runId: "r2", timestamp: 1 };
    const asked = { id: "2", role: "assistant", content: [{ type: "toolCall", id: "tc3", name: "calc.eval", arguments: "{oops" }], runId: "r2" };
    s = history(online(), { messages: [asked, toolResult] });
    assert.equal(card(s, "tc3").view.label, "Failed: bad arguments");
    s = history(online(), {
      messages: [],
      inFlightRun: { runId: "r3", seq: 1, text: "", tools: [{ toolCallId: "tc4", name: "calc.eval", args: {}, status: "failed", isError: true, errorKind: "unknown_tool", result: { content: [] } }] },
    });
    assert.equal(card(s, "tc4").view.label, "Failed: not a tool this agent may call");
    s = events(started(online(), "r1"), [start("r1", "tc5"), result("r1", "tc5", "ok")]);
    assert.equal(card(s, "tc5").view.label, "Done");
    assert.equal(card(s, "tc5").view.errorKind, null);
  });

  test("result text: text blocks joined, other blocks named, strings as they are", () => {
    assert.equal(resultText({ content: [text("a"), { type: "image", data: "…" }, text("b")] }), "a\n[image]\nb");
    assert.equal(resultText("plain"), "plain");
    assert.equal(resultText(null), "");
    assert.equal(formatProgress({ progress: 2, total: null, message: null }), "2");
  });
});

// --- run end --------------------------------------------------------------------------------------------

describe("a card never spins after its run ended", () => {
  test("the run's terminal chat event ends its open cards; the result still shows when it comes", () => {
    let s = started(online(), "r1");
    s = events(s, [start("r1", "tc1"), start("r1", "tc2"), result("r1", "tc2", "ok")]);
    s = events(s, [chat("r1", 1, "aborted", { stopReason: "rpc" })]);
    let c = card(s, "tc1");
    assert.equal(c.view.state, "ended");
    assert.equal(c.view.spinning, false);
    assert.equal(c.view.label, "Ended with the run");
    assert.equal(card(s, "tc2").view.state, "succeeded", "a finished call keeps its outcome");
    s = events(s, [result("r1", "tc1", "cancelled by the abort", "cancelled")]);
    c = card(s, "tc1");
    assert.equal(c.view.state, "cancelled");
    assert.equal(c.view.result.text, "cancelled by the abort");
  });

  test("a terminal ack ends them too, and a start for a run that already ended never spins", () => {
    let s = started(online(), "r1");
    s = events(s, [start("r1", "tc1")]);
    const response = { type: "res", id: "x", ok: true, payload: { runId: "r1", status: "timeout", stopReason: "timeout", sessionKey: KEY, sessionId: GEN } };
    s = reduce(s, { type: "send/ack", key: KEY, runId: "r1", response });
    assert.equal(card(s, "tc1").view.spinning, false);
    s = events(s, [start("r1", "tc3")]);
    assert.equal(card(s, "tc3").view.state, "ended");
  });

  test("history that no longer has the run open ends its calls that have no result", () => {
    let s = online();
    s = history(s, {
      messages: [
        { id: "1", role: "user", content: [text("do it")], runId: "r1" },
        { id: "2", role: "assistant", content: [{ type: "toolCall", id: "tc1", name: "calc.eval", arguments: { expr: "1" } }], runId: "r1" },
      ],
    });
    assert.equal(card(s, "tc1").view.state, "ended");
  });

  test("the run settled from history (it ended while the page was away) stops spinning", () => {
    let s = started(online(), "r1");
    s = events(s, [start("r1", "tc1")]);
    s = history(s, { messages: [{ id: "1", role: "user", content: [text("hello")], runId: "r1" }, { id: "2", role: "assistant", content: [text("done")], runId: "r1" }] });
    assert.equal(s.runs[`${KEY}|r1`].phase, "final");
    assert.equal(card(s, "tc1").view.state, "ended");
  });
});

// --- history --------------------------------------------------------------------------------------------

describe("history → cards (§13.4)", () => {
  const messages = [
    { id: "1", role: "user", content: [text("what is 6*7, then note it")], runId: "r1" },
    {
      id: "2",
      role: "assistant",
      content: [text("Let me compute."), { type: "toolCall", id: "tc1", name: "calc.eval", arguments: '{"expr":"6*7"}' }],
      runId: "r1",
    },
    { id: "3", role: "toolResult", toolCallId: "tc1", toolName: "calc.eval", content: [text("42")], isError: false, status: "succeeded", runId: "r1", timestamp: 1 },
    { id: "4", role: "assistant", content: [{ type: "toolCall", id: "tc2", name: "notes.write", arguments: { text: "42" } }], runId: "r1" },
    { id: "5", role: "toolResult", toolCallId: "tc2", toolName: "notes.write", content: [text("denied by the user")], isError: true, status: "denied", runId: "r1", timestamp: 2 },
    { id: "6", role: "assistant", content: [text("It is 42; I was not allowed to note it.")], runId: "r1" },
  ];

  test("a card per toolCall block with its result; no bubble for toolResult messages; one reply per run", () => {
    const s = history(online(), { messages });
    const items = conversation(s, KEY);
    assert.deepEqual(items.map((i) => i.id), ["u:r1", "t:tc1", "t:tc2", "a:r1"]);
    assert.ok(!items.some((i) => i.role === "toolResult"));
    assert.equal(items[1].view.state, "succeeded");
    assert.equal(items[1].view.result.text, "42");
    assert.equal(items[1].view.args.text, '{\n  "expr": "6*7"\n}');
    assert.equal(items[2].view.state, "denied");
    assert.equal(items[2].view.result.isError, true);
    assert.equal(items[3].text, "Let me compute.\n\nIt is 42; I was not allowed to note it.");
    assert.equal(items[3].state, "final");
  });

  test("history loaded twice, or after the events, keeps one card per call", () => {
    let s = started(online(), "r1", "what is 6*7, then note it");
    s = events(s, [start("r1", "tc1", { expr: "6*7" }), result("r1", "tc1", "42")]);
    s = history(s, { messages });
    s = history(s, { messages });
    assert.deepEqual(cards(s).map((c) => c.toolCallId), ["tc1", "tc2"]);
  });

  test("inFlightRun.tools: the open run's calls, pending approval or running; a later event finishes them", () => {
    let s = online();
    s = history(s, {
      messages: [{ id: "1", role: "user", content: [text("go")], runId: "r1" }],
      inFlightRun: {
        runId: "r1",
        seq: 2,
        text: "Working",
        tools: [
          { toolCallId: "tc1", name: "calc.eval", args: { expr: "1" }, status: "succeeded", isError: false, result: { content: [text("1")] } },
          { toolCallId: "tc2", name: "notes.write", args: { text: "x" }, status: "pending_approval" },
        ],
      },
    });
    assert.deepEqual(conversation(s, KEY).map((i) => i.id), ["u:r1", "t:tc1", "t:tc2", "a:r1"]);
    assert.equal(card(s, "tc1").view.result.text, "1");
    assert.equal(card(s, "tc2").view.state, "pending_approval");
    assert.equal(card(s, "tc2").view.spinning, true);
    assert.equal(conversation(s, KEY)[3].state, "streaming");
    s = events(s, [result("r1", "tc2", "written")]);
    assert.equal(card(s, "tc2").view.state, "succeeded");
  });

  // The gateway's own shape: one assistant message per run, its toolCall blocks where they came in the
  // text, each followed by a toolResult item whose id is the call's id (not a message number).
  const turn = (n, runId, callId) => [
    { id: String(n), role: "user", content: [text(`q${n}`)], runId },
    { id: String(n + 1), role: "assistant", content: [text("Looking.\n\n"), { type: "toolCall", id: callId, name: "clock.now", arguments: {} }, text("It is noon.")], runId },
    { id: callId, role: "toolResult", toolCallId: callId, toolName: "clock.now", content: [text("12:00")], isError: false, status: "succeeded", runId, timestamp: 1 },
  ];

  test("the gateway's shape: the reply's text around its calls is one reply; toolResult items page with their message", () => {
    let s = history(online(), { messages: [...turn(3, "r2", "tc-b")], hasMore: true });
    assert.deepEqual(conversation(s, KEY).map((i) => i.id), ["u:r2", "t:tc-b", "a:r2"]);
    assert.equal(conversation(s, KEY)[2].text, "Looking.\n\nIt is noon.");
    s = reduce(s, { type: "history/loaded", key: KEY, token: 0, older: true, payload: { sessionId: GEN, messages: turn(1, "r1", "tc-a"), hasMore: false } });
    assert.deepEqual(conversation(s, KEY).map((i) => i.id), ["u:r1", "t:tc-a", "a:r1", "u:r2", "t:tc-b", "a:r2"]);
    assert.equal(s.convs[KEY].messages.length, 6, "the older page's toolResult item is kept");
    assert.equal(card(s, "tc-a").view.state, "succeeded");
    assert.equal(card(s, "tc-a").view.result.text, "12:00");
    // A refresh of the newest page keeps the older page, with its toolResult item.
    s = history(s, { messages: [...turn(3, "r2", "tc-b")], hasMore: true });
    assert.equal(s.convs[KEY].messages.length, 6);
    assert.deepEqual(conversation(s, KEY).map((i) => i.id), ["u:r1", "t:tc-a", "a:r1", "u:r2", "t:tc-b", "a:r2"]);
  });
});

// --- approvals ---------------------------------------------------------------------------------------------

describe("approvals (§13.5)", () => {
  function waiting() {
    let s = started(online(), "r1");
    s = events(s, [start("r1", "tc1", { text: "hi" }), agent("r1", "approval", { phase: "requested", approvalId: "ap1", toolCallId: "tc1", status: "pending" })]);
    return events(s, [["plugin.approval.requested", approvalPayload("ap1", "tc1", "r1")]], 1_000_000);
  }

  test("requested: the card waits with a prompt and a countdown from the server's times", () => {
    const s = waiting();
    const view = card(s, "tc1").view;
    assert.equal(view.state, "pending_approval");
    assert.equal(view.spinning, true);
    assert.equal(view.approval.state, "pending");
    assert.equal(view.approval.title, "Write a note?");
    assert.deepEqual(view.approval.decisions, ["allow-once", "deny"]);
    // The page's clock (1_000_000 on arrival) is skewed from the server's: the deadline is arrival + 120 s.
    assert.equal(view.approval.deadline, 1_120_000);
    assert.deepEqual(pendingApprovals(s).map((a) => a.id), ["ap1"]);
  });

  test("allowed (by anyone): the call runs; the recorded decision replaces the buttons", () => {
    let s = waiting();
    s = events(s, [["plugin.approval.resolved", { id: "ap1", decision: "allow-once", resolvedBy: "alice", ts: 1, request: approvalPayload("ap1", "tc1", "r1").request }]]);
    let view = card(s, "tc1").view;
    assert.equal(view.state, "running");
    assert.equal(view.approval.state, "resolved");
    assert.deepEqual(view.approval.decisions, []);
    assert.equal(view.approval.decisionText, "Allowed once by alice");
    assert.equal(view.approval.deadline, null, "no countdown once decided");
    s = events(s, [result("r1", "tc1", "written")]);
    view = card(s, "tc1").view;
    assert.equal(view.state, "succeeded");
    assert.equal(view.approval.decisionText, "Allowed once by alice");
    assert.deepEqual(pendingApprovals(s), []);
  });

  test("expired or denied: no spinner while the result is on its way", () => {
    for (const [decision, state] of [["expired", "expired"], ["deny", "denied"], ["cancelled", "cancelled"]]) {
      let s = waiting();
      s = events(s, [agent("r1", "approval", { phase: "resolved", approvalId: "ap1", toolCallId: "tc1", status: decision })]);
      const view = card(s, "tc1").view;
      assert.equal(view.state, state);
      assert.equal(view.spinning, false);
      assert.equal(view.approval.state, "resolved");
    }
  });

  test("the first recorded decision stays", () => {
    let s = waiting();
    s = events(s, [["plugin.approval.resolved", { id: "ap1", decision: "deny", resolvedBy: "bob", ts: 1 }], ["plugin.approval.resolved", { id: "ap1", decision: "allow-once", ts: 2 }]]);
    assert.equal(s.approvals.ap1.decision, "deny");
  });

  test("sending disables the buttons; the answer shows what was recorded, even if it differs", () => {
    let s = waiting();
    s = reduce(s, { type: "approval/sending", id: "ap1", decision: "allow-once" });
    let view = card(s, "tc1").view;
    assert.equal(view.approval.state, "sending");
    assert.equal(view.approval.sending, "allow-once");
    const again = reduce(s, { type: "approval/sending", id: "ap1", decision: "deny" });
    assert.equal(again.approvals.ap1.sending, "allow-once", "one decision at a time");
    const response = { type: "res", id: "x", ok: true, payload: { id: "ap1", decision: "expired", resolvedBy: "system", ts: 3, request: {} } };
    s = reduce(s, { type: "approval/answered", id: "ap1", decision: "allow-once", response });
    view = card(s, "tc1").view;
    assert.equal(view.approval.state, "resolved");
    assert.equal(view.approval.decisionText, "Expired: no decision in time");
    assert.equal(view.state, "expired");
  });

  test("a refused or unanswered decision says why and can be tried again; NOT_FOUND closes the prompt", () => {
    let s = reduce(waiting(), { type: "approval/sending", id: "ap1", decision: "deny" });
    const timeout = Object.assign(new Error("no response"), { name: "RequestError", code: "TIMEOUT", timeoutMs: 30000, sent: true });
    s = reduce(s, { type: "approval/answered", id: "ap1", decision: "deny", error: timeout });
    let view = card(s, "tc1").view;
    assert.equal(view.approval.state, "pending");
    assert.match(view.approval.error, /Deny timed out/);
    s = reduce(s, { type: "approval/sending", id: "ap1", decision: "deny" });
    const response = { type: "res", id: "x", ok: false, error: { code: "NOT_FOUND", message: "unknown approval" } };
    s = reduce(s, { type: "approval/answered", id: "ap1", decision: "deny", response });
    view = card(s, "tc1").view;
    assert.equal(view.approval.state, "resolved");
    assert.deepEqual(view.approval.decisions, []);
    assert.match(view.approval.error, /no longer knows/);
  });

  test("plugin.approval.list after a reconnect replaces the pending approvals", () => {
    let s = waiting();
    s = events(s, [["plugin.approval.requested", approvalPayload("ap2", "tc2", "r1")]]);
    const token = s.tick;
    s = events(s, [["plugin.approval.requested", approvalPayload("ap3", "tc3", "r1")]]); // after the request went out
    s = reduce(s, { type: "approvals/listed", token, at: 2_000_000, payload: [approvalPayload("ap2", "tc2", "r1"), approvalPayload("ap4", "tc4", "r1", { key: OTHER })] });
    assert.equal(s.approvals.ap1.status, "resolved", "not listed: decided while away");
    assert.equal(s.approvals.ap1.decision, null);
    assert.equal(card(s, "tc1").view.state, "running", "no longer waiting: it runs, or its result comes");
    assert.equal(card(s, "tc1").view.approval.decisionText, "No longer waiting for a decision");
    assert.equal(s.approvals.ap2.status, "pending");
    assert.equal(s.approvals.ap3.status, "pending", "arrived after the list was read");
    assert.equal(s.approvals.ap4.status, "pending");
    assert.deepEqual(pendingApprovals(s, OTHER).map((a) => a.id), ["ap4"]);
    assert.equal(s.tools.tc4.key, OTHER, "a card is made from the request");
    assert.equal(s.tools.tc4.status, "pending_approval");
  });

  test("a listed approval's deadline comes from the server's clock offset (tick ts)", () => {
    let s = online();
    s = events(s, [["tick", { ts: 5_100_000 }]], 1_000_000); // the server is 4 100 000 ms ahead
    s = reduce(s, { type: "approvals/listed", token: s.tick, at: 1_000_500, payload: [approvalPayload("ap1", "tc1", "r1")] });
    assert.equal(s.approvals.ap1.deadline, 5_120_000 - 4_100_000);
  });

  test("an approval whose run ended shows no buttons", () => {
    let s = waiting();
    s = events(s, [chat("r1", 1, "aborted", { stopReason: "rpc" })]);
    const view = card(s, "tc1").view;
    assert.equal(view.state, "ended");
    assert.equal(view.approval.state, "closed");
    assert.deepEqual(view.approval.decisions, []);
    assert.deepEqual(pendingApprovals(s), []);
  });

  test("countdown text", () => {
    assert.equal(formatTimeLeft(120_000), "2:00 left");
    assert.equal(formatTimeLeft(64_500), "1:05 left");
    assert.equal(formatTimeLeft(0), "Time is up");
    assert.equal(formatTimeLeft(3_720_000), "1 h 2 min left");
  });
});

// --- session list ----------------------------------------------------------------------------------------

describe("needs approval in the session list (waitingFor)", () => {
  function row(fields = {}) {
    return { key: KEY, sessionId: GEN, agentId: "main", label: "", status: "running", hasActiveRun: true, activeRunIds: ["r1"], queuedRunIds: [], version: 1, createdAt: 1, updatedAt: 1, waitingFor: null, ...fields };
  }

  test("a row waiting for approval says so; one that is not does not", () => {
    let s = reduce(online(), { type: "session/row", row: row({ waitingFor: "approval", version: 2 }) });
    let item = sessionList(s).find((i) => i.key === KEY);
    assert.equal(item.needsApproval, true);
    assert.equal(item.status, "running");
    s = reduce(s, { type: "session/row", row: row({ waitingFor: null, version: 3 }) });
    item = sessionList(s).find((i) => i.key === KEY);
    assert.equal(item.needsApproval, false);
  });

  test("a pending approval this page holds marks its session, even before the row says so", () => {
    let s = events(online(), [["plugin.approval.requested", approvalPayload("ap1", "tc1", "r1", { key: OTHER })]]);
    assert.equal(needsApproval(s, OTHER), true);
    assert.equal(needsApproval(s, KEY), false);
    s = events(s, [["plugin.approval.resolved", { id: "ap1", decision: "deny", ts: 1 }]]);
    assert.equal(needsApproval(s, OTHER), false);
  });

  test("a lagging row does not keep the badge for a run this page saw end", () => {
    let s = started(online(), "r1");
    s = reduce(s, { type: "session/row", row: row({ waitingFor: "approval", version: 2 }) });
    s = events(s, [chat("r1", 1, "final", { message: { role: "assistant", content: [text("ok")] } })]);
    assert.equal(needsApproval(s, KEY), false);
  });

  test("deleting a session drops its calls and approvals", () => {
    let s = waitingOther();
    s = reduce(s, { type: "session/deleted", key: OTHER });
    assert.deepEqual(Object.keys(s.tools), []);
    assert.deepEqual(Object.keys(s.approvals), []);
  });

  function waitingOther() {
    return events(online(), [["plugin.approval.requested", approvalPayload("ap1", "tc1", "r1", { key: OTHER })]]);
  }
});

// --- the card's DOM ---------------------------------------------------------------------------------------

/** Just enough of a DOM for toolcard.js; innerHTML and friends throw, so untrusted text cannot take that path. */
class FakeElement {
  constructor(tag) {
    this.tagName = tag.toUpperCase();
    this.children = [];
    this.attributes = new Map();
    this.dataset = {};
    this.className = "";
    this.hidden = false;
    this.disabled = false;
    this.type = "";
    this._text = "";
  }
  append(...nodes) {
    for (const node of nodes) this.children.push(node);
  }
  get textContent() {
    return this.children.length ? this.children.map((c) => c.textContent).join("") : this._text;
  }
  set textContent(value) {
    this.children = [];
    this._text = String(value);
  }
  set innerHTML(_) {
    throw new Error("innerHTML must not be used for a tool card");
  }
  get innerHTML() {
    throw new Error("innerHTML must not be used for a tool card");
  }
  insertAdjacentHTML() {
    throw new Error("insertAdjacentHTML must not be used for a tool card");
  }
  setAttribute(name, value) {
    this.attributes.set(name, String(value));
  }
  getAttribute(name) {
    return this.attributes.has(name) ? this.attributes.get(name) : null;
  }
  hasAttribute(name) {
    return this.attributes.has(name);
  }
  removeAttribute(name) {
    this.attributes.delete(name);
  }
}

const fakeDocument = { createElement: (tag) => new FakeElement(tag) };

function walk(node, out = []) {
  out.push(node);
  for (const child of node.children) walk(child, out);
  return out;
}
const byTestId = (root, id) => walk(root).find((n) => n.dataset.testid === id);

describe("tool card DOM (toolcard.js)", () => {
  function hostileView() {
    let s = started(online(), "r1");
    s = events(s, [
      agent("r1", "tool", { phase: "start", name: `evil${XSS}`, toolCallId: "tc1", args: { html: XSS } }),
      agent("r1", "approval", { phase: "requested", approvalId: "ap1", toolCallId: "tc1", status: "pending" }),
    ]);
    const payload = approvalPayload("ap1", "tc1", "r1");
    payload.request.title = XSS;
    payload.request.description = XSS;
    s = events(s, [["plugin.approval.requested", payload]]);
    s = events(s, [["plugin.approval.resolved", { id: "ap1", decision: "allow-once", resolvedBy: XSS, ts: 1 }]]);
    s = events(s, [agent("r1", "tool", { phase: "result", name: "x", toolCallId: "tc1", isError: true, status: "failed", result: { content: [text(XSS)] } })]);
    return card(s, "tc1").view;
  }

  test("a result with <img onerror> and <script> stays text: no element is made from it", () => {
    const row = createToolCard(fakeDocument);
    updateToolCard(row, hostileView(), { now: 0 });
    const result = byTestId(row, "tool-result");
    assert.equal(result.hidden, false);
    assert.equal(result.children[1].textContent, XSS, "the whole result, as text");
    assert.equal(result.children[1].children.length, 0);
    assert.ok(byTestId(row, "tool-name").textContent.includes("<img"), "the name as text");
    assert.ok(byTestId(row, "tool-args").textContent.includes("<script>"), "the arguments as text");
    assert.ok(byTestId(row, "tool-approval").textContent.includes("onerror"), "the approval's title and description as text");
    const tags = new Set(walk(row).map((n) => n.tagName));
    for (const bad of ["IMG", "SCRIPT", "IFRAME", "SVG", "A"]) assert.ok(!tags.has(bad), `no ${bad} element`);
  });

  test("state, buttons and countdown follow the view", () => {
    let s = started(online(), "r1");
    s = events(s, [start("r1", "tc1"), ["plugin.approval.requested", approvalPayload("ap1", "tc1", "r1")]], 1_000_000);
    const row = createToolCard(fakeDocument);
    updateToolCard(row, card(s, "tc1").view, { now: 1_000_000 });
    const tc = byTestId(row, "tool-card");
    assert.equal(tc.getAttribute("data-state"), "pending_approval");
    assert.equal(byTestId(row, "tool-status").textContent, "Waiting for approval");
    const approve = byTestId(row, "approve");
    assert.equal(approve.disabled, false);
    assert.equal(approve.getAttribute("data-approval-id"), "ap1");
    assert.equal(approve.dataset.action, "approve");
    const countdown = byTestId(row, "approval-countdown");
    assert.equal(countdown.textContent, "2:00 left");
    updateCountdown(countdown, 1_000_000 + 61_000);
    assert.equal(countdown.textContent, "0:59 left");

    s = reduce(s, { type: "approval/sending", id: "ap1", decision: "allow-once" });
    updateToolCard(row, card(s, "tc1").view, { now: 1_000_000 });
    assert.equal(approve.disabled, true);
    assert.equal(byTestId(row, "deny").disabled, true);
    assert.equal(approve.textContent, "Allowing…");

    s = events(s, [["plugin.approval.resolved", { id: "ap1", decision: "deny", resolvedBy: "bob", ts: 1 }]]);
    updateToolCard(row, card(s, "tc1").view, { now: 1_000_000 });
    assert.equal(tc.getAttribute("data-state"), "denied");
    assert.equal(byTestId(row, "approval-decision").textContent, "Denied by bob");
    assert.equal(byTestId(row, "approval-decision").hidden, false);
    assert.equal(countdown.hasAttribute("data-deadline"), false);
    assert.equal(countdown.hidden, true);
    assert.equal(tc.hasAttribute("aria-busy"), false, "not busy once decided");
  });
});
