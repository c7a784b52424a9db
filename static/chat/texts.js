// What the page says, in words: failures (notices), a finished run's details, why a run stopped.
// Pure; imports nothing.

/** One line for a run's details: "1.2 s · 12 in / 30 out tokens"; "" when nothing is known. */
export function formatDetails(details) {
  if (!details) return "";
  const parts = [];
  if (details.durationMs != null) {
    const ms = details.durationMs;
    parts.push(ms < 1000 ? `${ms} ms` : ms < 60000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`);
  }
  const tokens = [];
  if (details.promptTokens != null) tokens.push(`${details.promptTokens} in`);
  if (details.completionTokens != null) tokens.push(`${details.completionTokens} out`);
  if (tokens.length) parts.push(`${tokens.join(" / ")} tokens`);
  return parts.join(" · ");
}

/**
 * The notice for `what` (a method such as `sessions.create`, or a page action) that failed, saying what
 * failed. `error` is what the failure left:
 * - a gateway error response's `error` ({code, message, retryAfterMs?}): its message and code;
 * - a client RequestError TIMEOUT: no answer in time (the connection may well be up);
 * - a client RequestError DISCONNECTED: not connected, the only failure that says so, and whether the
 *   request went out before the socket closed;
 * - any other exception: a fault in this page, by its name and message.
 */
export function failureText(what, error) {
  if (error && error.name === "RequestError") {
    if (error.code === "TIMEOUT") {
      const within = error.timeoutMs ? ` within ${Math.round(error.timeoutMs / 1000)} s` : "";
      return `${what} timed out: no answer from the gateway${within}. It may still take effect; check before trying again.`;
    }
    if (error.code === "DISCONNECTED") {
      return error.sent
        ? `Not connected: the connection closed before ${what} was answered. Check whether it took effect once the connection is back.`
        : `Not connected: ${what} was not sent. Try again when the connection is back.`;
    }
  }
  if (error instanceof Error) return `${what} failed in this page: ${error.name}: ${error.message}`;
  if (error && typeof error === "object" && (error.code || error.message)) {
    const code = error.code || "ERROR";
    const retry = error.retryAfterMs ? `; try again in ${Math.ceil(error.retryAfterMs / 1000)} s` : "";
    return error.message ? `${what} failed: ${error.message} (${code}${retry})` : `${what} failed: ${code}${retry}`;
  }
  return `${what} failed: ${error == null ? "no reason given" : String(error)}`;
}

/** What an aborted reply says about why it stopped (its `stopReason`). */
export function stopLabel(reason) {
  switch (reason) {
    case "rpc":
    case "stop":
      return "Stopped";
    case "interrupt":
    case "steer":
      return "Interrupted by a newer message";
    case "steered":
      return "Delivered into the running reply";
    case "reset":
      return "Stopped: session reset";
    case "delete":
      return "Stopped: session deleted";
    case "operator":
      return "Stopped by an operator";
    default:
      return "Stopped";
  }
}
