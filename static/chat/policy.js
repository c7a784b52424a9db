// Session keys and the limits the page takes from the server (`hello-ok.policy`). Pure; imports nothing.

/**
 * What the page must not copy from the server: the message limit and the key patterns.
 * These defaults hold until `hello-ok.policy` arrives; `policyFrom(hello)` replaces them.
 */
export const DEFAULT_POLICY = Object.freeze({
  maxMessageChars: 32000,
  keyNameRe: /^[A-Za-z0-9._:-]{1,200}$/,
  agentIdRe: /^[A-Za-z0-9_-]{1,64}$/,
});

function patternOr(source, fallback) {
  if (typeof source !== "string" || !source) return fallback;
  try {
    return new RegExp(source);
  } catch {
    return fallback; // not a JavaScript pattern: keep the built-in one
  }
}

/** The page's policy from a `hello-ok` frame, field by field, falling back to the defaults. */
export function policyFrom(hello) {
  const p = (hello && hello.policy) || {};
  const max = Number(p.maxMessageChars);
  return {
    maxMessageChars: Number.isInteger(max) && max > 0 ? max : DEFAULT_POLICY.maxMessageChars,
    keyNameRe: patternOr(p.sessionKeyNamePattern, DEFAULT_POLICY.keyNameRe),
    agentIdRe: patternOr(p.agentIdPattern, DEFAULT_POLICY.agentIdRe),
  };
}

/** Canonical session key (§3): a bare name means `agent:main:<name>`. Null when invalid. */
export function canonicalKey(raw, defaultAgent = "main", policy = DEFAULT_POLICY) {
  if (typeof raw !== "string" || !raw) return null;
  if (raw.startsWith("agent:")) {
    const parts = raw.split(":");
    if (parts.length < 3) return null;
    const agent = parts[1];
    const name = parts.slice(2).join(":");
    if (!policy.agentIdRe.test(agent) || !policy.keyNameRe.test(name)) return null;
    return `agent:${agent}:${name}`;
  }
  return policy.keyNameRe.test(raw) ? `agent:${defaultAgent}:${raw}` : null;
}

/** The short name of a session key, for display. */
export function shortName(key) {
  const parts = String(key).split(":");
  return parts.length >= 3 ? parts.slice(2).join(":") : String(key);
}
