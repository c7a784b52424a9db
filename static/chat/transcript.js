// Reading transcript messages (`chat.history` items and `chat` event messages): their text, their
// tool calls, and a run's reply across several assistant messages. Pure; imports nothing.

/** The text of a message's text blocks, joined; null when it has no content list. */
export function textOf(message) {
  if (!message || !Array.isArray(message.content)) return null;
  return message.content
    .filter((part) => part && part.type === "text" && typeof part.text === "string")
    .map((part) => part.text)
    .join("");
}

/** The ids of a message's `toolCall` blocks, in order. */
export function toolCallIdsOf(message) {
  if (!message || !Array.isArray(message.content)) return [];
  return message.content.filter((b) => b && b.type === "toolCall" && typeof b.id === "string" && b.id).map((b) => b.id);
}

/**
 * A run's reply from the transcript, by run id: `{text, aborted, first, last, toolCallIds}`. With tools a
 * reply may span several assistant messages (one per model step, TOOLS.md §13.4): their texts are
 * one reply, a paragraph apart, as its `chat` events carry it; `last` is the last of them.
 */
export function repliesByRun(messages) {
  const replies = new Map();
  for (const m of messages) {
    if (!m || m.role !== "assistant" || !m.runId) continue;
    const text = textOf(m) || "";
    const toolCallIds = toolCallIdsOf(m);
    const known = replies.get(m.runId);
    if (!known) {
      replies.set(m.runId, { text, aborted: Boolean(m.aborted), last: m, first: m, toolCallIds });
      continue;
    }
    known.text = known.text && text ? `${known.text}\n\n${text}` : known.text || text;
    known.aborted = Boolean(m.aborted);
    known.last = m;
    known.toolCallIds.push(...toolCallIds);
  }
  return replies;
}

/** Duration and token usage of a finished run (`chat` terminal event or history message), or null. */
export function detailsOf(source) {
  if (!source) return null;
  const details = {};
  if (Number.isFinite(source.durationMs)) details.durationMs = source.durationMs;
  const usage = source.usage;
  if (usage && typeof usage === "object") {
    if (Number.isFinite(usage.promptTokens)) details.promptTokens = usage.promptTokens;
    if (Number.isFinite(usage.completionTokens)) details.completionTokens = usage.completionTokens;
  }
  return Object.keys(details).length ? details : null;
}
