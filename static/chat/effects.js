// Carrying out the reducer's effects (`state.effects`, state.js): the requests and the composer
// text it asks for after a change.

import { setComposer } from "./composer.js";
import { flushOutbox, requestApprovals, requestHistory, requestList } from "./gateway.js";
import { state } from "./store.js";

/** Carry out one effect. */
export function runEffect(eff) {
  switch (eff.type) {
    case "history":
      requestHistory(eff.key);
      break;
    case "list":
      requestList();
      break;
    case "flush":
      flushOutbox();
      break;
    case "approvals":
      requestApprovals();
      break;
    case "retry":
      setTimeout(flushOutbox, eff.afterMs);
      break;
    case "draft":
      if (eff.key === state.currentKey) setComposer(state.drafts[eff.key] || "");
      break;
    default:
      break;
  }
}
