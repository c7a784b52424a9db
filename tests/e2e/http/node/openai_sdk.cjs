"use strict";
// The official `openai` npm package against a gateway's /v1 (tests/e2e/http/test_node_sdk.py runs it):
// `node openai_sdk.cjs SCENARIO`; AGENTGATE_BASE_URL and AGENTGATE_KEY say where and as whom. The last
// line of stdout is one JSON object: what the client saw.
const OpenAI = require("openai");

const baseURL = process.env.AGENTGATE_BASE_URL;
const client = new OpenAI({ baseURL, apiKey: process.env.AGENTGATE_KEY, maxRetries: 0, timeout: 30000 });
const user = (content) => [{ role: "user", content }];

async function failure(call) {
  try {
    await call();
    return null;
  } catch (err) {
    return { name: err.constructor.name, status: err.status, code: err.code, param: err.param, type: err.type };
  }
}

const scenarios = {
  async basics() {
    const models = (await client.models.list()).data.map((m) => ({ id: m.id, object: m.object, owned_by: m.owned_by }));
    const { data: whole, response } = await client.chat.completions
      .create({ model: "main", messages: user("hello from node") })
      .withResponse();
    const stream = await client.chat.completions.create({
      model: "openclaw/main",
      messages: user("[[tick:5]] streamed from node"),
      stream: true,
      stream_options: { include_usage: true },
    });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    const notFound = await failure(() => client.chat.completions.create({ model: "nobody", messages: user("x") }));
    const badBody = await failure(() => client.chat.completions.create({ model: "main", messages: user("x"), n: 2 }));
    const stranger = new OpenAI({ baseURL, apiKey: "agt_not-a-key", maxRetries: 0 });
    const unauthorized = await failure(() => stranger.models.list());
    return {
      models,
      whole,
      headers: {
        runId: response.headers.get("x-agentgate-run-id"),
        sessionKey: response.headers.get("x-agentgate-session-key"),
      },
      chunks,
      notFound,
      badBody,
      unauthorized,
    };
  },

  async named() {
    const headers = { "x-agentgate-session-key": "node-notes" };
    const first = await client.chat.completions.create({ model: "main", messages: user("first note") }, { headers });
    // an application that sends the whole chat again: only the new input counts in a named session
    const messages = [...user("first note"), { role: "assistant", content: first.choices[0].message.content }];
    const second = await client.chat.completions.create(
      { model: "main", messages: [...messages, ...user("second note")] },
      { headers },
    );
    return { first: first.choices[0].message.content, second: second.choices[0].message.content };
  },

  async leave() {
    // a stream the application stops reading: breaking out of the loop aborts the request
    const { data: stream, response } = await client.chat.completions
      .create({ model: "main", messages: user("[[words:400]] [[tick:20]]"), stream: true })
      .withResponse();
    let text = "";
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? "";
      if (text.includes("word3")) break;
    }
    return {
      text,
      left: Date.now(),
      runId: response.headers.get("x-agentgate-run-id"),
      sessionKey: response.headers.get("x-agentgate-session-key"),
    };
  },

  async responses() {
    const stream = await client.responses.create({ model: "main", input: "[[tick:5]] responses from node", stream: true });
    const events = [];
    for await (const event of stream) events.push(event);
    const whole = await client.responses.create({ model: "main", input: "whole from node" });
    const retrieved = await client.responses.retrieve(whole.id);
    const next = await client.responses.create({ model: "main", input: "and then", previous_response_id: whole.id });
    return {
      events: events.map((e) => ({ type: e.type, sequence_number: e.sequence_number, delta: e.delta ?? null })),
      final: events[events.length - 1].response,
      whole: { id: whole.id, status: whole.status, output_text: whole.output_text },
      retrieved: { id: retrieved.id, status: retrieved.status, output_text: retrieved.output_text },
      next: { status: next.status, output_text: next.output_text, previous_response_id: next.previous_response_id },
    };
  },
};

const scenario = scenarios[process.argv[2]];
if (!scenario) {
  console.error(`unknown scenario ${process.argv[2]}; known: ${Object.keys(scenarios).join(", ")}`);
  process.exit(2);
}
scenario().then(
  (out) => console.log(JSON.stringify(out)),
  (err) => {
    console.error(err && err.stack ? err.stack : err);
    process.exit(1);
  },
);
