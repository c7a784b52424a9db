// The open conversation as the page shows it: a list of items (messages, replies, tool cards) made
// from history and what is live on this page, and what Retry and Edit act on. Pure selectors.

import { inlineCommand } from "./commands.js";
import { ACTIVE_PHASES, TERMINAL_PHASES, emptyConv, runKey, runOf } from "./model.js";
import { activity, liveRuns } from "./runs.js";
import { replyParts, restOf, steersIn, wasTaken } from "./steering.js";
import { stopLabel } from "./texts.js";
import { TOOL_TERMINAL, approvalOf } from "./tools.js";
import { toolCardView } from "./toolview.js";
import { detailsOf, repliesByRun, textOf, toolCallIdsOf } from "./transcript.js";

function assistantFromRun(run, inTranscript = false) {
  const base = { id: `a:${run.id}`, role: "assistant", runId: run.id, text: run.text || "", details: run.details || null };
  switch (run.phase) {
    case "started":
    case "streaming":
      return { ...base, state: "streaming" };
    case "final":
      return { ...base, state: "final" };
    case "aborted":
      if (wasTaken(run)) return null; // a steer its run took: its answer is that run's reply
      return { ...base, state: "aborted", meta: stopLabel(run.stopReason) };
    case "error":
      if (run.rejected && !inTranscript) return null; // shown on the user's message instead
      return { ...base, state: "error", error: run.error || "The run failed.", errorKind: run.errorKind || null };
    default:
      return null;
  }
}

function userFromRun(run) {
  if (run.userText == null) return null;
  const base = { id: `u:${run.id}`, role: "user", runId: run.id, text: run.userText, attachments: run.attachments || [] };
  if (run.phase === "sending") return { ...base, state: "sending" };
  if (run.phase === "queued") return { ...base, state: "queued", position: run.position };
  if (run.phase === "steering") return { ...base, state: "steering" };
  if (run.phase === "error" && run.rejected) {
    return { ...base, state: "error", error: run.error, errorKind: run.errorKind || null, unconfirmed: run.errorKind === "unconfirmed" };
  }
  return { ...base, state: "final" };
}

/** The item of tool call `call`: `{id: "t:<toolCallId>", role: "tool", runId, toolCallId, state, view}`. */
function toolItem(state, call) {
  const view = toolCardView(call, approvalOf(state, call));
  return { id: `t:${call.id}`, role: "tool", runId: call.runId, toolCallId: call.id, state: view.state, view };
}

/**
 * The tool cards of session `key`, by run, in call order (`view`: toolview.js `toolCardView`). A call
 * belongs to the conversation of its session, and of its generation when both are known.
 */
function toolCardsByRun(state, key, gen) {
  const byRun = new Map();
  const calls = Object.values(state.tools)
    .filter((c) => c.key === key && (!gen || !c.sessionId || c.sessionId === gen))
    .sort((a, b) => a.order - b.order);
  for (const call of calls) {
    const list = byRun.get(call.runId) || [];
    list.push(toolItem(state, call));
    byRun.set(call.runId, list);
  }
  return byRun;
}

// The items are built in `out`: `{state, key, conv, row, replies, cards, items, placed}`, where
// `placed` holds the ids of the tool cards already in `items` (each card goes in once).

/** Run `runId`'s cards not placed yet: those named by `firstIds` first (the transcript's order), then the rest. */
function pushCards(out, runId, firstIds = []) {
  const list = out.cards.get(runId) || [];
  const byId = new Map(list.map((item) => [item.toolCallId, item]));
  for (const id of [...firstIds, ...list.map((item) => item.toolCallId)]) {
    const item = byId.get(id);
    if (!item || out.placed.has(item.id)) continue;
    out.placed.add(item.id);
    out.items.push(item);
  }
}

/** A user message of the transcript; with no reply there yet, its run's cards and live reply (or failure). */
function pushUserMessage(out, m) {
  const { row } = out;
  const branch = { entryId: m.id, siblings: m.siblings || null }; // (docs/branches.md)
  const attachments = Array.isArray(m.attachments) ? m.attachments.filter((a) => a && typeof a.fileId === "string") : [];
  out.items.push({ id: m.runId ? `u:${m.runId}` : `m:${m.id}`, role: "user", runId: m.runId || null, text: textOf(m) || "", state: "final", attachments, ...branch });
  if (!m.runId || out.replies.has(m.runId)) return;
  const run = runOf(out.state, out.key, m.runId);
  pushCards(out, m.runId);
  const live = run ? assistantFromRun(run, true) : null;
  if (live) out.items.push(live);
  else if (!run && row && row.lastRunId === m.runId && !row.hasActiveRun && (row.status === "failed" || row.status === "timeout")) {
    out.items.push({ id: `a:${m.runId}`, role: "assistant", runId: m.runId, text: "", state: "error", error: row.lastRunError || `The run ended: ${row.status}.`, errorKind: row.status });
  }
}

/** A run's reply in the transcript, once, at its first message: its cards, then the reply. */
function pushReply(out, m) {
  const reply = out.replies.get(m.runId);
  if (reply.first !== m) return; // one reply per run, at its first message
  const run = runOf(out.state, out.key, m.runId);
  pushCards(out, m.runId, reply.toolCallIds);
  if (run && ACTIVE_PHASES.has(run.phase) && out.conv.inFlightRunId === m.runId) {
    // Still running (history holds its steps so far): the live reply, which carries the whole text
    // (less the parts before its steers, shown above them).
    const live = assistantFromRun(run, true);
    if (reply.before) live.text = restOf(live.text, reply.before);
    out.items.push(live);
    return;
  }
  const item = {
    id: `a:${m.runId}`,
    role: "assistant",
    runId: m.runId,
    text: reply.text,
    state: reply.aborted ? "aborted" : "final",
    details: detailsOf(reply.last) || (run && run.details) || null,
    entryId: m.id,
    siblings: m.siblings || null,
  };
  if (run && run.phase === "error" && !run.rejected) {
    item.state = "error";
    item.error = run.error;
    item.errorKind = run.errorKind || null;
  } else if (reply.aborted) {
    item.meta = run && run.phase === "aborted" ? stopLabel(run.stopReason) : "Stopped";
  }
  out.items.push(item);
}

/**
 * A part of a steered run's reply (`out.split`): an earlier part is shown as it is in the transcript,
 * with its own calls; the last one, when no steer follows it, as any reply (pushReply).
 */
function pushPart(out, m) {
  const split = out.split.get(m.runId);
  const k = split.parts.findIndex((p) => p.first === m);
  if (k < 0) return;
  if (k === split.parts.length - 1 && !split.tail) {
    pushReply(out, m);
    return;
  }
  const part = split.parts[k];
  const byId = new Map((out.cards.get(m.runId) || []).map((item) => [item.toolCallId, item]));
  for (const id of part.toolCallIds) {
    const item = byId.get(id);
    if (!item || out.placed.has(item.id)) continue;
    out.placed.add(item.id);
    out.items.push(item);
  }
  out.items.push({ id: `a:${m.runId}:${k}`, role: "assistant", runId: m.runId, text: part.text, state: "final", details: null, part: true });
}

/** A steering message; after the last steer of a run still working (or not reloaded since), the rest of its reply. */
function pushSteer(out, m, into) {
  out.items.push({ id: m.runId ? `u:${m.runId}` : `m:${m.id}`, role: "user", runId: m.runId || null, text: textOf(m) || "", state: "final", steer: true });
  const split = out.split.get(into);
  if (!split || split.tail !== m) return;
  const run = runOf(out.state, out.key, into);
  if (!run) return;
  pushCards(out, into);
  const live = assistantFromRun(run, true);
  if (live) out.items.push({ ...live, text: restOf(live.text, split.parts.map((p) => p.text)) });
}

/** Any other message (no run id): an assistant message's cards, then the message. */
function pushOtherMessage(out, m) {
  if (m.role === "assistant") {
    for (const id of toolCallIdsOf(m)) {
      const call = out.state.tools[id];
      if (!call || out.placed.has(`t:${id}`)) continue;
      out.placed.add(`t:${id}`);
      out.items.push(toolItem(out.state, call));
    }
  }
  out.items.push({ id: `m:${m.id}`, role: m.role, runId: m.runId || null, text: textOf(m) || "", state: m.aborted ? "aborted" : "final", details: detailsOf(m) });
}

/**
 * Calls of runs not placed above (their run is not loaded yet): at the end while they are open, or
 * when their run is known to this page; an ended call of a run on an older page waits for that page.
 */
function pushStrayCards(out) {
  for (const list of out.cards.values()) {
    for (const item of list) {
      if (out.placed.has(item.id)) continue;
      const call = out.state.tools[item.toolCallId];
      const open = !TOOL_TERMINAL.has(call.status) && !call.runEnded;
      if (!open && !out.state.runs[runKey(out.key, call.runId)]) continue;
      out.placed.add(item.id);
      out.items.push(item);
    }
  }
}

/**
 * The conversation as a list of items: history first, then what is live on this page. A run's tool
 * cards come right before its reply, in call order (the transcript's order of `toolCall` blocks
 * first); `toolResult` messages are not items of their own, their outcome is on the card.
 */
export function conversation(state, key) {
  const conv = state.convs[key] || emptyConv();
  const replies = repliesByRun(conv.messages);
  const cards = toolCardsByRun(state, key, conv.sessionId);
  const out = { state, key, conv, row: state.rows[key], replies, cards, items: [], placed: new Set(), split: new Map() };
  // Steered runs: their reply in parts, the steering messages between them (steering.js).
  const parts = replyParts(conv.messages, textOf, toolCallIdsOf);
  const open = (runId) => conv.inFlightRunId === runId || ACTIVE_PHASES.has((runOf(state, key, runId) || {}).phase);
  const steers = steersIn(conv.messages, parts, open, (runId) => wasTaken(runOf(state, key, runId)));
  for (const [m, into] of steers) {
    const list = parts.get(into);
    const split = out.split.get(into) || { parts: list, tail: null };
    if (conv.messages.indexOf(m) > conv.messages.indexOf(list[list.length - 1].last)) split.tail = m;
    out.split.set(into, split);
  }
  for (const [runId, list] of parts) {
    if (list.length > 1 && !out.split.has(runId)) out.split.set(runId, { parts: list, tail: null });
  }
  for (const [runId, split] of out.split) {
    // The reply pushReply shows is the last part; the ones before it are shown above their steers.
    const last = split.parts[split.parts.length - 1];
    const before = split.parts.slice(0, -1).map((p) => p.text);
    out.replies = new Map(out.replies);
    out.replies.set(runId, { ...replies.get(runId), ...last, toolCallIds: [...last.toolCallIds], before });
  }
  const userRuns = new Set();
  for (const m of conv.messages) if (m.runId && m.role === "user") userRuns.add(m.runId);
  for (const m of conv.messages) {
    if (m.role === "toolResult") continue;
    if (m.role === "user" && steers.has(m)) pushSteer(out, m, steers.get(m));
    else if (m.role === "user") pushUserMessage(out, m);
    else if (m.role === "assistant" && m.runId && out.split.has(m.runId)) pushPart(out, m);
    else if (m.role === "assistant" && m.runId) pushReply(out, m);
    else pushOtherMessage(out, m);
  }
  for (const run of liveRuns(state, key)) {
    if (userRuns.has(run.id) || replies.has(run.id)) continue;
    const user = userFromRun(run);
    if (user) out.items.push(user);
    pushCards(out, run.id);
    const reply = assistantFromRun(run);
    if (reply) out.items.push(reply);
  }
  pushStrayCards(out);
  return out.items;
}

// --- message actions -------------------------------------------------------------------------------

/** The user's text of run `runId` in this conversation (history or this page), or null. */
function userTextOf(state, key, items, runId) {
  if (!runId) return null;
  const item = items.find((i) => i.role === "user" && i.runId === runId);
  if (item) return item.text;
  const run = state.runs[runKey(key, runId)];
  return run && run.userText != null ? run.userText : null;
}

/**
 * What Retry would send again for session `key`: the last reply's user text, when that reply
 * (or a send refused by its ack) is the last item and has ended. `enabled` is false while a run
 * of the session is active, queued or being sent: a retry goes through chat.send like any
 * message, and never beside a running reply. Null when there is nothing to retry.
 */
export function retryTarget(state, key, items = conversation(state, key)) {
  const last = items[items.length - 1];
  if (!last || !last.runId) return null;
  const retryable =
    (last.role === "assistant" && TERMINAL_PHASES.has(last.state)) ||
    (last.role === "user" && last.state === "error" && !last.unconfirmed);
  if (!retryable) return null;
  const text = userTextOf(state, key, items, last.runId);
  if (text == null || !text.trim() || inlineCommand(text, state.commands)) return null;
  const act = activity(state, key);
  return { itemId: last.id, runId: last.runId, text, enabled: !act.active && !act.pending && act.queued === 0 };
}

/** The last user message of session `key` that Edit may put back in the composer, or null. */
export function editTarget(state, key, items = conversation(state, key)) {
  for (let i = items.length - 1; i >= 0; i -= 1) {
    const item = items[i];
    if (item.role !== "user") continue;
    if (item.state === "sending" || item.state === "queued" || item.state === "steering") return null;
    return { itemId: item.id, runId: item.runId, text: item.text };
  }
  return null;
}
