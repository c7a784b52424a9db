// What the page's unit tests share: the session keys and generation they use, and a reducer run.

import { reduce } from "../../static/chat/state.js";

export const KEY = "agent:main:main";
export const OTHER = "agent:main:other";
export const GEN = "11111111-1111-1111-1111-111111111111";

/** The state after `actions`, in order. */
export function run(state, actions) {
  let s = state;
  for (const a of actions) s = reduce(s, a);
  return s;
}
