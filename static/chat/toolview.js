// What a tool card shows (TOOLS.md §13), as plain data: a call's arguments, progress, status and
// approval in words, and the card's whole view (`toolCardView`), which toolcard.js draws. Pure.

import { TOOL_TERMINAL } from "./tools.js";

/** Arguments for display: pretty JSON; a string that is not JSON as it came (`valid: false`). */
export function formatArgs(args) {
  if (args === undefined) return { text: "", valid: true, known: false };
  if (typeof args === "string") {
    try {
      const parsed = JSON.parse(args);
      if (parsed !== null && typeof parsed === "object") return { text: JSON.stringify(parsed, null, 2), valid: true, known: true };
    } catch {
      // not JSON: shown as the model sent it
    }
    return { text: args, valid: false, known: true };
  }
  try {
    return { text: JSON.stringify(args, null, 2) ?? String(args), valid: true, known: true };
  } catch {
    return { text: String(args), valid: false, known: true };
  }
}

/** "3 / 10 · Fetching" from an `update`'s partialResult; "" when there is nothing to say. */
export function formatProgress(progress) {
  if (!progress) return "";
  const parts = [];
  if (progress.progress != null) parts.push(progress.total != null ? `${progress.progress} / ${progress.total}` : String(progress.progress));
  if (progress.message) parts.push(progress.message);
  return parts.join(" · ");
}

/** "1:05 left" until an approval's deadline (`ms` from now); "Time is up" once it passed. */
export function formatTimeLeft(ms) {
  if (!Number.isFinite(ms)) return "";
  if (ms <= 0) return "Time is up";
  const total = Math.ceil(ms / 1000);
  if (total >= 3600) return `${Math.floor(total / 3600)} h ${Math.floor((total % 3600) / 60)} min left`;
  return `${Math.floor(total / 60)}:${String(total % 60).padStart(2, "0")} left`;
}

const STATUS_LABELS = {
  running: "Running…",
  pending_approval: "Waiting for approval",
  succeeded: "Done",
  failed: "Failed",
  denied: "Denied",
  expired: "Expired: no decision in time",
  cancelled: "Cancelled",
  unknown: "Outcome unknown: the tool was not run again",
  client: "Handed to the API client",
  skipped: "Skipped",
  ended: "Ended with the run",
};

// why a call `failed` (its `errorKind`, docs/tools.md); the other terminal states say it themselves
const FAILED_LABELS = {
  bad_arguments: "bad arguments",
  unknown_tool: "not a tool this agent may call",
  limit: "over the run's tool call limit",
  tool_timeout: "the tool timed out",
  tool_server: "the tool's server failed",
  tool_error: "the tool reported an error",
};

/** A label for each call state shown on a card (`data-state`), with why a failed call failed. */
export function toolStatusLabel(state, errorKind = null) {
  if (state === "failed" && errorKind) return `Failed: ${FAILED_LABELS[errorKind] || errorKind}`;
  return STATUS_LABELS[state] || state;
}

/** What a resolved approval says: the recorded decision, and who made it. */
export function decisionText(approval) {
  if (!approval || approval.status !== "resolved") return "";
  const by = approval.resolvedBy ? ` by ${approval.resolvedBy}` : "";
  switch (approval.decision) {
    case "allow-once":
      return `Allowed once${by}`;
    case "deny":
      return `Denied${by}`;
    case "expired":
      return "Expired: no decision in time";
    case "cancelled":
      return "Cancelled: the run was stopped before a decision";
    case null:
      return "No longer waiting for a decision";
    default:
      return `Decision: ${approval.decision}${by}`;
  }
}

const DECISION_STATE = { deny: "denied", expired: "expired", cancelled: "cancelled" };

/**
 * Everything a tool card shows, as plain data (all text is untrusted and goes into the DOM as text).
 * `state` is the card's `data-state`: running, pending_approval, a terminal state, or `ended`
 * (the run ended with the call open). `spinning` only while running or waiting for approval.
 */
export function toolCardView(call, approval = null) {
  let state = call.status;
  if (!TOOL_TERMINAL.has(state)) {
    if (call.runEnded) state = "ended";
    else if (approval && approval.status === "resolved" && DECISION_STATE[approval.decision]) state = DECISION_STATE[approval.decision];
  }
  const terminal = TOOL_TERMINAL.has(call.status);
  const args = formatArgs(call.args);
  const view = {
    id: call.id,
    runId: call.runId,
    name: call.name || (approval && approval.toolName) || "tool",
    state,
    label: toolStatusLabel(state, terminal ? call.errorKind : null),
    errorKind: terminal ? call.errorKind || null : null,
    spinning: state === "running" || state === "pending_approval",
    args,
    // a call handed to the API client has no result here: the client runs it
    result: terminal && call.status !== "client" ? { text: call.result || "", isError: call.isError } : null,
    progress: !terminal && !call.runEnded && call.progress
      ? { value: call.progress.progress, max: call.progress.total, text: formatProgress(call.progress) }
      : null,
    approval: null,
  };
  if (approval) {
    const open = approval.status === "pending" && !terminal && !call.runEnded;
    let astate = "resolved";
    if (open) astate = approval.sending ? "sending" : "pending";
    else if (approval.status === "pending") astate = "closed"; // the call or its run ended first
    view.approval = {
      id: approval.id,
      title: approval.title || `Allow ${view.name}?`,
      description: approval.description || "",
      severity: approval.severity || "",
      state: astate,
      decisions: open ? approval.allowedDecisions : [],
      sending: approval.sending,
      deadline: open ? approval.deadline : null,
      decisionText: astate === "resolved" ? decisionText(approval) : astate === "closed" ? "No longer waiting for a decision" : "",
      error: approval.error || "",
    };
  }
  return view;
}
