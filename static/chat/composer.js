// The composer: its text, its height, and the Send / Stop buttons and status line under it.

import { attached, attachmentsBlock } from "./attachments.js";
import { setAttr, setText } from "./dom.js";
import { activity } from "./runs.js";
import { scheduleRender, state } from "./store.js";
import { needsApproval } from "./tools.js";
import { els, page } from "./view.js";

const HINT = "Enter sends · Shift+Enter adds a line";
const STEER_HINT = "Enter sends into the current reply · Alt+Enter queues it for after · Stop interrupts";

/** Put `text` in the composer (a draft of another session, an edited message). */
export function setComposer(text) {
  if (els.composer.value !== text) els.composer.value = text;
  autosize();
  scheduleRender();
}

/** Grow the composer with its text, up to 40% of the window. */
export function autosize() {
  els.composer.style.height = "auto";
  els.composer.style.height = `${Math.min(els.composer.scrollHeight, window.innerHeight * 0.4)}px`;
}

/** Send and Stop, and the status line: what the open session's runs are doing. */
export function renderComposer() {
  const act = activity(state, state.currentKey);
  els.stop.hidden = !act.active;
  els.stop.disabled = page.stopping;
  const blocked = attachmentsBlock();
  els.send.disabled = Boolean(blocked) || (!els.composer.value.trim() && attached.length === 0);
  let text = "";
  let kind = "";
  if (blocked) {
    text = blocked;
    kind = blocked === "Uploading…" ? "" : "warn";
  } else if (state.conn.status !== "online" && act.pending) {
    text = "Offline: your message goes out when the connection is back.";
    kind = "warn";
  } else if (act.active) {
    const doing = needsApproval(state, state.currentKey) ? "Waiting for your approval…" : "Replying…";
    text = act.queued ? `${doing} · ${act.queued} queued` : doing;
  } else if (act.queued) {
    text = `${act.queued} queued`;
  } else if (act.pending) {
    text = "Sending…";
  }
  setText(els.status, text);
  setAttr(els.status, "data-kind", kind);
  // While a run works, Enter sends into it (a steer, read at its next step); Alt+Enter queues instead.
  els.send.title = act.active ? "Send into the current reply: the agent reads it at its next step" : "Send";
  const hint = document.getElementById("composer-hint");
  if (hint) setText(hint, act.active ? STEER_HINT : HINT);
}
