// Steering (docs/protocol-notes.md, "Steering"): a message typed while a run works is sent into that
// run (`queueMode: "steer"`). Its ack, its events, and where it sits in the transcript: the run's
// reply so far, the steering message(s), then the rest of the reply. Pure; imports nothing.
//
// A steer is a run record of its own (keyed by its idempotency key, which is the steer's run id) in
// the phase `steering` while the working run has not taken it (neither active nor queued: Cancel
// withdraws it). Taken, it ends `aborted` with stopReason `steered` and shows as a user message with
// no reply of its own; not taken before the run ended, it becomes a queued follow-up.

/** A `started` ack with `steered: true`: the run record `r` (a draft) waits to be taken. */
export function ackSteered(r, payload) {
  if (r.phase !== "sending" && r.phase !== "queued") return false; // its events were first
  r.phase = "steering";
  r.position = null;
  r.steeredInto = typeof payload.runId === "string" ? payload.runId : null;
  return true;
}

/**
 * A `chat` status event of a steer (`steer: "pending" | "followup"`) applied to the draft run `r`:
 * true when it was one. `followup`: the run ended before taking it, so it waits in the queue.
 */
export function steerStatus(r, p) {
  if (p.steer === "followup") {
    r.phase = "queued";
    r.steeredInto = null;
    return true;
  }
  // (`queued` too: a steer of another tab or client, first seen by this event)
  if (p.steer === "pending" && (r.phase === "sending" || r.phase === "queued" || r.phase === "steering")) {
    r.phase = "steering";
    return true;
  }
  return false;
}

/** Did run `run` (a page record) end as a steer its run took? Its answer is that run's reply. */
export const wasTaken = (run) => Boolean(run) && run.phase === "aborted" && run.stopReason === "steered";

/**
 * A run's reply in the transcript split by the steering messages inside it: `runId` → parts in
 * order, each `{first, last, text, aborted, toolCallIds}`. Each part is the run's assistant messages
 * with no user message between them (one per model step, a paragraph apart, as repliesByRun).
 */
export function replyParts(messages, textOf, toolCallIdsOf) {
  const parts = new Map();
  let open = null; // the run of the last assistant message, while no user message came after it
  for (const m of messages) {
    if (!m || m.role === "toolResult") continue;
    if (m.role !== "assistant" || !m.runId) {
      open = null;
      continue;
    }
    const text = textOf(m) || "";
    const list = parts.get(m.runId) || [];
    const cur = list[list.length - 1];
    if (cur && open === m.runId) {
      cur.text = cur.text && text ? `${cur.text}\n\n${text}` : cur.text || text;
      cur.aborted = Boolean(m.aborted);
      cur.last = m;
      cur.toolCallIds.push(...toolCallIdsOf(m));
    } else {
      list.push({ first: m, last: m, text, aborted: Boolean(m.aborted), toolCallIds: toolCallIdsOf(m) });
      parts.set(m.runId, list);
    }
    open = m.runId;
  }
  return parts;
}

/**
 * The steering messages of the transcript: user message → the run it was sent into. A user message
 * lies inside a run's reply only as a steer (any other message starts its run after that one ended),
 * so it is one when a later part of the same run follows it, or when nothing follows yet and the run
 * still works (`open(runId)`) or the page saw the message taken (`taken(runId)` of its own run id).
 */
export function steersIn(messages, parts, open, taken) {
  const steers = new Map();
  const lastIndex = new Map();
  messages.forEach((m, i) => {
    if (m && m.role === "assistant" && m.runId) lastIndex.set(m.runId, i);
  });
  let into = null; // the run whose part came last, while only its steers followed it
  messages.forEach((m, i) => {
    if (!m || m.role === "toolResult") return;
    if (m.role === "assistant") {
      into = m.runId && parts.has(m.runId) ? m.runId : null;
      return;
    }
    if (m.role !== "user" || !into || (m.runId && parts.has(m.runId))) {
      into = null;
      return;
    }
    if (lastIndex.get(into) > i || open(into) || (m.runId && taken(m.runId))) steers.set(m, into);
    else into = null;
  });
  return steers;
}

/**
 * The live text of a run after its parts in the transcript (`before`, their texts). Its `chat` events
 * carry the whole reply, history's `inFlightRun` only the part after the last steer: either way, what
 * is not in the parts already.
 */
export function restOf(text, before) {
  const whole = text || "";
  const done = before.filter(Boolean).join("\n\n");
  if (!done || !whole.startsWith(done)) return whole;
  return whole.slice(done.length).replace(/^\n\n/, "");
}
