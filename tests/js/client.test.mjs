// Unit tests of the WebSocket client (static/chat/client.js) against a fake WebSocket.

import assert from "node:assert/strict";
import { afterEach, test } from "node:test";

import { backoffDelay, GatewayClient, RequestError } from "../../static/chat/client.js";

const sockets = [];

class FakeSocket {
  constructor(url) {
    this.url = url;
    this.sent = [];
    this.readyState = 0;
    this.closedWith = null;
    sockets.push(this);
    setTimeout(() => {
      this.readyState = 1;
      this.onopen && this.onopen();
      this.push({ type: "event", event: "connect.challenge", payload: { nonce: "n", ts: 1 }, seq: 1 });
    }, 0);
  }
  send(text) {
    this.sent.push(JSON.parse(text));
  }
  push(frame) {
    this.onmessage && this.onmessage({ data: JSON.stringify(frame) });
  }
  close(code = 1000) {
    if (this.readyState === 3) return;
    this.readyState = 3;
    this.closedWith = code;
    setTimeout(() => this.onclose && this.onclose({ code }), 0);
  }
  /** The server answers the last request of `method`. */
  answer(method, payload, ok = true, error = undefined) {
    const req = [...this.sent].reverse().find((f) => f.method === method);
    assert.ok(req, `no ${method} request`);
    this.push({ type: "res", id: req.id, ok, payload, error });
    return req;
  }
}

const tick = (ms = 0) => new Promise((resolve) => setTimeout(resolve, ms));
let client = null;

afterEach(() => {
  client && client.stop();
  client = null;
  sockets.length = 0;
});

function makeClient(extra = {}) {
  const log = [];
  client = new GatewayClient({
    url: "ws://test/ws/gateway",
    WebSocketImpl: FakeSocket,
    backoff: { baseMs: 5, maxMs: 20 },
    onEvent: (f) => log.push(["event", f.event, f.seq]),
    onReady: (hello) => log.push(["ready", hello.protocol]),
    onClosed: (info) => log.push(["closed", info.code]),
    onFatal: (err) => log.push(["fatal", err.code]),
    ...extra,
  });
  client.start();
  return log;
}

test("backoff grows, is capped and jittered", () => {
  const mid = () => 0.5;
  assert.equal(backoffDelay(0, { baseMs: 100, maxMs: 1000, random: mid }), 100);
  assert.equal(backoffDelay(2, { baseMs: 100, maxMs: 1000, random: mid }), 400);
  assert.equal(backoffDelay(9, { baseMs: 100, maxMs: 1000, random: mid }), 1000);
  assert.equal(backoffDelay(0, { baseMs: 100, maxMs: 1000, random: () => 0 }), 75);
});

test("handshake: connect answers the challenge with protocol 4, then requests are matched by id", async () => {
  const log = makeClient();
  await tick(5);
  const ws = sockets[0];
  const connect = ws.sent[0];
  assert.equal(connect.method, "connect");
  assert.equal(connect.params.minProtocol, 4);
  assert.equal(connect.params.maxProtocol, 4);
  await assert.rejects(client.request("health"), { code: "DISCONNECTED" }, "no requests before hello");
  ws.answer("connect", { type: "hello-ok", protocol: 4, policy: { tickIntervalMs: 30000 } });
  await tick();
  assert.deepEqual(log, [["event", "connect.challenge", 1], ["ready", 4]]);
  const pending = client.request("sessions.list", { limit: 5 });
  ws.answer("sessions.list", { sessions: [] });
  const res = await pending;
  assert.equal(res.ok, true);
  assert.deepEqual(res.payload, { sessions: [] });
});

test("connect declares the tool-events cap and asks for operator.approvals beside the scopes it had", async () => {
  makeClient();
  await tick(5);
  const { params } = sockets[0].sent[0];
  assert.deepEqual(params.caps, ["tool-events"]);
  // Requested scopes are intersected with the user's: read, write (and admin for staff) as before, plus approvals.
  assert.deepEqual(params.scopes, ["operator.read", "operator.write", "operator.admin", "operator.approvals"]);
  assert.equal(params.role, "operator");
});

test("a dropped socket rejects pending requests and reconnects by itself", async () => {
  const log = makeClient();
  await tick(5);
  sockets[0].answer("connect", { protocol: 4 });
  await tick();
  const pending = client.request("chat.history", { sessionKey: "main" });
  sockets[0].close(1006);
  await assert.rejects(pending, { code: "DISCONNECTED" });
  await tick(60);
  assert.equal(sockets.length, 2, "a new socket was opened");
  sockets[1].answer("connect", { protocol: 4 });
  await tick();
  assert.equal(client.ready, true);
  assert.deepEqual(log.filter((e) => e[0] !== "event"), [["ready", 4], ["closed", 1006], ["ready", 4]]);
});

test("an unauthorized handshake is fatal: no reconnect loop", async () => {
  const log = makeClient();
  await tick(5);
  sockets[0].answer("connect", undefined, false, { code: "UNAUTHORIZED", message: "authentication required" });
  sockets[0].close(4008);
  await tick(60);
  assert.equal(sockets.length, 1);
  assert.ok(log.some((e) => e[0] === "fatal" && e[1] === "UNAUTHORIZED"));
});

test("reconnectNow during the handshake opens no second socket", async () => {
  makeClient();
  await tick(5);
  assert.equal(sockets.length, 1);
  assert.equal(sockets[0].readyState, 1, "open");
  assert.equal(client.ready, false, "connect sent, hello not answered yet");
  client.reconnectNow(); // the browser fired "online" mid-handshake
  await tick(5);
  assert.equal(sockets.length, 1, "no second socket while the first is handshaking");
  assert.equal(sockets[0].closedWith, null, "the first socket is still the live one");
  sockets[0].answer("connect", { protocol: 4 });
  await tick();
  assert.equal(client.ready, true);
});

test("reconnectNow while waiting out the backoff connects at once", async () => {
  const log = makeClient({ backoff: { baseMs: 60_000, maxMs: 60_000 } });
  await tick(5);
  sockets[0].answer("connect", { protocol: 4 });
  await tick();
  sockets[0].close(1006);
  await tick(5);
  assert.ok(log.some((e) => e[0] === "closed"));
  assert.equal(sockets.length, 1, "the backoff is long: no new socket yet");
  client.reconnectNow();
  assert.equal(sockets.length, 2, "connected at once");
  await tick(5);
  sockets[1].answer("connect", { protocol: 4 });
  await tick();
  assert.equal(client.ready, true);
});

test("a request without an answer says why: not sent, closed after it went out, or timed out", async () => {
  makeClient();
  await tick(5);
  await assert.rejects(client.request("sessions.create"), (err) => {
    assert.ok(err instanceof RequestError);
    assert.deepEqual([err.name, err.code, err.sent], ["RequestError", "DISCONNECTED", false]);
    return true;
  });
  sockets[0].answer("connect", { protocol: 4 });
  await tick();
  const slow = client.request("sessions.create", {}, 20);
  await assert.rejects(slow, { name: "RequestError", code: "TIMEOUT", sent: true, timeoutMs: 20 });
  const cut = client.request("sessions.delete", { sessionKey: "main" });
  sockets[0].close(1006);
  await assert.rejects(cut, { name: "RequestError", code: "DISCONNECTED", sent: true });
});
