// Drives the real `openclaw-node` client against a gateway, as a new user would.
// Usage: node scenario.cjs <scenario> <sessionKey>
// Env: OPENCLAW_URL, OPENCLAW_TOKEN, OPENCLAW_DEVICE_FILE; NODE_PATH finds the pinned package.
// Prints one JSON line: what the client saw.
"use strict";

// openclaw-node checks `WebSocket.OPEN` on the global, which Node 20 does not define
// (Node 22 does); its own `ws` dependency stands in for it.
if (typeof globalThis.WebSocket === "undefined") {
  globalThis.WebSocket = require("ws");
}
const { OpenClawClient } = require("openclaw-node");

const [scenario, sessionKey] = process.argv.slice(2);

function newClient() {
  return new OpenClawClient({
    url: process.env.OPENCLAW_URL,
    token: process.env.OPENCLAW_TOKEN,
    autoReconnect: false,
    deviceIdentityPath: process.env.OPENCLAW_DEVICE_FILE,
  });
}

async function collect(client, message) {
  const chunks = [];
  for await (const chunk of client.chat(message, { sessionKey })) {
    chunks.push({ type: chunk.type, text: chunk.text, runId: chunk.runId });
  }
  return chunks;
}

async function errorOf(promise) {
  try {
    return { ok: true, payload: await promise };
  } catch (err) {
    return { ok: false, message: err.message };
  }
}

const scenarios = {
  async stream(client) {
    return { chunks: await collect(client, "hello from openclaw-node") };
  },
  async sync(client) {
    return { text: await client.chatSync("sync hello", { sessionKey }) };
  },
  async failure(client) {
    const dispatch = await collect(client, "[[fail:dispatch]]");
    const setup = await collect(client, "[[fail:setup]]");
    return { dispatch, setup, sessions: await client.sessions.list({ search: sessionKey }) };
  },
  async abort(client) {
    const chunks = [];
    let abort = null;
    for await (const chunk of client.chat("go [[words:400]] [[tick:20]]", { sessionKey })) {
      chunks.push({ type: chunk.type, text: chunk.text, runId: chunk.runId });
      if (chunk.type === "text" && abort === null) {
        abort = client.chatAbort(sessionKey);
      }
    }
    const aborted = await abort;
    // the run is over on the server: a new chat on the same session runs at once
    const after = await client.chatSync("after the abort", { sessionKey });
    return { chunks, aborted, after, sessions: await client.sessions.list({ search: sessionKey }) };
  },
  async sessions(client) {
    await client.chatSync("remember me", { sessionKey });
    const list = await client.sessions.list({ limit: 5 });
    const history = await client.sessions.history(sessionKey, { limit: 10 });
    const reset = await client.sessions.reset(sessionKey);
    const afterReset = await client.sessions.history(sessionKey, { limit: 10 });
    const send = await errorOf(client.sessions.send(sessionKey, "no idempotencyKey"));
    return { list, history, reset, afterReset, send, health: await client.health() };
  },
};

async function main() {
  const client = newClient();
  client.on("error", () => {}); // surfaced through the results instead
  const hello = await client.connect();
  try {
    const result = await scenarios[scenario](client);
    result.hello = { methods: hello.features.methods, events: hello.features.events };
    process.stdout.write(JSON.stringify(result) + "\n");
  } finally {
    await client.disconnect();
  }
}

main().then(
  () => process.exit(0),
  (err) => {
    process.stderr.write(String(err && err.stack ? err.stack : err) + "\n");
    process.exit(1);
  },
);
