// Unit tests of the page's inline commands (static/chat/commands.js): the gateway's `commands.list`
// answer replaces the page's fallback, and the page goes by it (no resend, no Retry).

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { FALLBACK_COMMANDS, commandsFrom, inlineCommand } from "../../static/chat/commands.js";
import { retryTarget } from "../../static/chat/conversation.js";
import { outbox } from "../../static/chat/sends.js";
import { initialState, reduce } from "../../static/chat/state.js";
import { GEN, KEY, run } from "./support.mjs";

/** A `commands.list` entry as the gateway writes it (chat/protocol/wire.py). */
function command(name, acceptsArgs = false) {
  return { name, textAliases: [`/${name}`], description: name, category: "session", source: "native", scope: "text", acceptsArgs };
}

/** The gateway's answer: its commands as they are, plus `extra`, less `without`. */
function listed({ extra = [], without = [] } = {}) {
  const names = [["status"], ["think", true], ["verbose", true], ["model", true], ["new"], ["reset"], ["stop"]];
  return { commands: [...names.filter(([n]) => !without.includes(n)).map(([n, args]) => command(n, args)), ...extra] };
}

function online(commands = null) {
  const s = run(initialState(), [{ type: "conn/open" }, { type: "conn/ready", hello: { snapshot: { sessionDefaults: { mainSessionKey: KEY } } } }]);
  return commands ? reduce(s, { type: "commands/loaded", payload: commands }) : s;
}

/** `text` went out as run `runId`, and the socket dropped before its ack. */
function sentAndDropped(s, runId, text) {
  let t = reduce(s, { type: "send/request", key: KEY, runId, text });
  t = reduce(t, { type: "send/sent", key: KEY, runId, gen: t.conn.gen });
  t = reduce(t, { type: "conn/closed", retryInMs: 300 });
  t = reduce(t, { type: "send/unsent", key: KEY, runId });
  return run(t, [{ type: "conn/open" }, { type: "conn/ready", hello: {} }]);
}

/** `text` was sent as run `runId` and answered with a final reply. */
function answered(s, runId, text) {
  let t = reduce(s, { type: "send/request", key: KEY, runId, text });
  const response = { type: "res", id: "x", ok: true, payload: { runId, status: "started", sessionKey: KEY, sessionId: GEN } };
  t = reduce(t, { type: "send/ack", key: KEY, runId, response });
  const message = { role: "assistant", content: [{ type: "text", text: `echo: ${text}` }] };
  const frame = { type: "event", event: "chat", seq: t.conn.lastSeq + 1, payload: { runId, sessionKey: KEY, sessionId: GEN, seq: 1, state: "final", message } };
  return reduce(t, { type: "event", frame });
}

describe("inline commands from the gateway", () => {
  test("commands.list: commands that accept no argument only as the whole message, the others with one", () => {
    assert.deepEqual(commandsFrom(listed()), { bare: ["/status", "/new", "/reset", "/stop"], withArgs: ["/think", "/verbose", "/model"] });
    for (const payload of [null, {}, { commands: "x" }, { commands: [] }, { commands: [{ name: "x" }, 3] }]) {
      assert.equal(commandsFrom(payload), null, JSON.stringify(payload));
    }
  });

  test("the fallback is what the gateway lists, until its answer comes", () => {
    const loaded = commandsFrom(listed());
    assert.deepEqual([...FALLBACK_COMMANDS.bare].sort(), [...loaded.bare].sort());
    assert.deepEqual([...FALLBACK_COMMANDS.withArgs].sort(), [...loaded.withArgs].sort());
    assert.equal(initialState().commands, FALLBACK_COMMANDS);
  });

  test("the gateway's answer replaces the page's list; an unusable answer keeps it", () => {
    const s = online(listed({ extra: [command("halt")], without: ["verbose"] }));
    assert.equal(inlineCommand("/halt", s.commands), "/halt");
    assert.equal(inlineCommand("/halt now", s.commands), null);
    assert.equal(inlineCommand("/verbose on", s.commands), null);
    assert.equal(inlineCommand("/verbose on"), "/verbose", "without a list: the fallback");
    assert.equal(reduce(s, { type: "commands/loaded", payload: { commands: [] } }).commands, s.commands);
  });

  test("a command the gateway lists is not sent again after a dropped socket; one it no longer lists is", () => {
    const commands = listed({ extra: [command("halt")], without: ["stop"] });
    let s = sentAndDropped(online(commands), "c1", "/halt");
    assert.deepEqual(outbox(s), [], "/halt is a command here: not resent");
    assert.equal(s.runs[`${KEY}|c1`].errorKind, "unconfirmed");
    s = sentAndDropped(online(commands), "c2", "/stop");
    assert.deepEqual(outbox(s).map((r) => r.id), ["c2"], "/stop is a message to this gateway: resent");
  });

  test("Retry is not offered for a command the gateway lists", () => {
    const withHalt = online(listed({ extra: [command("halt")] }));
    assert.equal(retryTarget(answered(withHalt, "r1", "/halt"), KEY), null);
    assert.equal(retryTarget(answered(online(), "r1", "/halt"), KEY).text, "/halt", "not a command of the fallback");
  });
});
