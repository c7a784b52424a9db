// Inline commands (docs/protocol-notes.md): messages `chat.send` answers in the gateway without a
// run. The page needs to know them because the gateway does not deduplicate them by idempotency key:
// one that went out unanswered is never sent again, and Retry is not offered for one. Pure; imports
// nothing.
//
// The gateway defines them and lists them in its `commands.list` answer; the page loads that list
// after connecting (`commands/loaded`, kept in `state.commands`). `{bare, withArgs}`: `bare`
// commands only as the whole message, `withArgs` ones also followed by an argument (they accept
// one; the gateway refuses more).

/**
 * What the page goes by until the gateway's list is loaded (a message sent before it arrived, or
 * the state module used without a gateway, as the Node tests do): the gateway's list as it is.
 * The browser suite (tests/e2e/browser/test_commands.py) checks the two are the same.
 */
export const FALLBACK_COMMANDS = Object.freeze({
  bare: Object.freeze(["/stop", "/new", "/reset", "/status"]),
  withArgs: Object.freeze(["/think", "/verbose", "/model"]),
});

/** The page's commands from a `commands.list` answer (`{commands: [{textAliases, acceptsArgs}]}`), or null. */
export function commandsFrom(payload) {
  const list = payload && Array.isArray(payload.commands) ? payload.commands : null;
  if (!list) return null;
  const bare = [];
  const withArgs = [];
  for (const command of list) {
    if (!command || typeof command !== "object" || !Array.isArray(command.textAliases)) continue;
    const names = command.textAliases.filter((a) => typeof a === "string" && /^\/\S+$/.test(a));
    (command.acceptsArgs ? withArgs : bare).push(...names);
  }
  return bare.length || withArgs.length ? { bare, withArgs } : null;
}

/** The inline command a message is (its name, e.g. "/think"), or null. */
export function inlineCommand(text, commands = FALLBACK_COMMANDS) {
  if (typeof text !== "string") return null;
  const words = text.trim().split(/\s+/);
  if (commands.bare.includes(words[0])) return words.length === 1 ? words[0] : null;
  return commands.withArgs.includes(words[0]) ? words[0] : null;
}
