// The tool card (TOOLS.md §13): one tool call in the conversation, with its name, status, progress,
// arguments, result and approval prompt, drawn from `toolCardView` (toolview.js).
//
// Everything on a card comes from a model, an agent or an MCP server: it goes into the DOM as text
// (`textContent`), never as HTML. The buttons carry `data-action` (`approve`, `deny`) and
// `data-approval-id`; app.js handles their clicks with its one listener on the message list.
// Only `createElement`, `append`, attributes, `dataset` and `textContent` are used, so the Node
// tests (tests/js/tools.test.mjs) run this file against a small fake document.

import { setAttr, setHidden, setText } from "./dom.js";
import { formatTimeLeft } from "./toolview.js";

function el(doc, tag, className, testid) {
  const node = doc.createElement(tag);
  if (className) node.className = className;
  if (testid) node.dataset.testid = testid;
  return node;
}

/** A new, empty card row (`.msg-row` with `data-role="tool"`) for `document` `doc`. */
export function createToolCard(doc) {
  const row = el(doc, "div", "msg-row tool-row");
  row.dataset.role = "tool";
  const card = el(doc, "article", "tool-card", "tool-card");

  const head = el(doc, "div", "tool-head");
  const spinner = el(doc, "span", "tool-spinner");
  spinner.setAttribute("aria-hidden", "true");
  const kind = el(doc, "span", "tool-kind");
  kind.textContent = "Tool";
  const name = el(doc, "code", "tool-name", "tool-name");
  const status = el(doc, "span", "tool-status", "tool-status");
  head.append(spinner, kind, name, status);

  const progress = el(doc, "div", "tool-progress", "tool-progress");
  progress.hidden = true;
  const bar = el(doc, "progress", "tool-progress-bar");
  const progressText = el(doc, "span", "tool-progress-text");
  progress.append(bar, progressText);

  const args = el(doc, "details", "tool-args", "tool-args");
  const argsSummary = el(doc, "summary");
  const argsPre = el(doc, "pre", "tool-pre");
  args.append(argsSummary, argsPre);

  const approval = el(doc, "div", "tool-approval", "tool-approval");
  approval.hidden = true;
  approval.setAttribute("role", "group");
  const title = el(doc, "p", "tool-approval-title");
  const description = el(doc, "p", "tool-approval-desc");
  const actions = el(doc, "div", "tool-approval-actions");
  const approve = el(doc, "button", "btn btn-primary btn-small", "approve");
  approve.type = "button";
  approve.dataset.action = "approve";
  approve.textContent = "Allow once";
  const deny = el(doc, "button", "btn btn-quiet btn-small btn-danger-text", "deny");
  deny.type = "button";
  deny.dataset.action = "deny";
  deny.textContent = "Deny";
  const countdown = el(doc, "span", "tool-countdown", "approval-countdown");
  actions.append(approve, deny, countdown);
  const decision = el(doc, "p", "tool-approval-decision", "approval-decision");
  const error = el(doc, "p", "tool-approval-error", "approval-error");
  approval.append(title, description, actions, decision, error);

  const result = el(doc, "details", "tool-result", "tool-result");
  result.hidden = true;
  const resultSummary = el(doc, "summary");
  const resultLabel = el(doc, "span", "tool-result-label");
  const resultPreview = el(doc, "span", "tool-result-preview");
  resultSummary.append(resultLabel, resultPreview);
  const resultPre = el(doc, "pre", "tool-pre");
  result.append(resultSummary, resultPre);

  card.append(head, progress, args, approval, result);
  row.append(card);
  row._tool = {
    card, name, status, progress, bar, progressText, args, argsSummary, argsPre,
    approval, title, description, actions, approve, deny, countdown, decision, error,
    result, resultLabel, resultPreview, resultPre,
  };
  return row;
}

function firstLine(text, max = 80) {
  const line = String(text).split("\n", 1)[0].trim();
  return line.length > max ? `${line.slice(0, max - 1)}…` : line;
}

/** Bring card `row` (from createToolCard) up to date with `view` (toolview.js `toolCardView`). */
export function updateToolCard(row, view, { now = null } = {}) {
  const p = row._tool;
  setAttr(p.card, "data-state", view.state);
  setAttr(p.card, "data-error-kind", view.errorKind || "");
  setAttr(p.card, "data-tool-call-id", view.id);
  setAttr(p.card, "data-run-id", view.runId || "");
  setAttr(p.card, "aria-busy", view.spinning ? "true" : "");
  setText(p.name, view.name);
  setText(p.status, view.label);

  setHidden(p.progress, !view.progress);
  if (view.progress) {
    const { value, max, text } = view.progress;
    if (value != null && max != null) {
      if (p.bar.getAttribute("max") !== String(max)) p.bar.setAttribute("max", String(max));
      if (p.bar.getAttribute("value") !== String(value)) p.bar.setAttribute("value", String(value));
    } else {
      setAttr(p.bar, "value", ""); // indeterminate
    }
    setText(p.progressText, text);
  }

  const args = view.args;
  setHidden(p.args, !args.known);
  setText(p.argsSummary, args.valid ? "Arguments" : "Arguments (not valid JSON)");
  setText(p.argsPre, args.text);

  const a = view.approval;
  setHidden(p.approval, !a);
  if (a) {
    setAttr(p.approval, "data-state", a.state);
    setAttr(p.approval, "data-severity", a.severity);
    setAttr(p.approval, "data-approval-id", a.id);
    setAttr(p.approval, "aria-label", `Approval for ${view.name}`);
    setText(p.title, a.title);
    setText(p.description, a.description);
    setHidden(p.description, !a.description);
    const open = a.state === "pending" || a.state === "sending";
    setHidden(p.actions, !open);
    for (const [button, decision, label, busy] of [
      [p.approve, "allow-once", "Allow once", "Allowing…"],
      [p.deny, "deny", "Deny", "Denying…"],
    ]) {
      setHidden(button, !a.decisions.includes(decision));
      setText(button, a.sending === decision ? busy : label);
      button.disabled = a.state !== "pending";
      setAttr(button, "data-approval-id", a.id);
      setAttr(button, "aria-label", `${label}: ${view.name}`);
    }
    setAttr(p.countdown, "data-deadline", open && Number.isFinite(a.deadline) ? String(a.deadline) : "");
    updateCountdown(p.countdown, now);
    setText(p.decision, a.decisionText);
    setHidden(p.decision, !a.decisionText);
    setText(p.error, a.error);
    setHidden(p.error, !a.error);
  }

  const r = view.result;
  setHidden(p.result, !r);
  if (r) {
    setAttr(p.result, "data-error", r.isError ? "true" : "");
    setText(p.resultLabel, r.isError ? "Error output" : "Result");
    setText(p.resultPreview, r.text ? firstLine(r.text) : "(no output)");
    setText(p.resultPre, r.text);
  }
}

/** The countdown `node` (`data-deadline`, page clock ms) at page time `now`; hidden without a deadline. */
export function updateCountdown(node, now) {
  const deadline = Number(node.getAttribute("data-deadline"));
  const has = node.hasAttribute("data-deadline") && Number.isFinite(deadline) && Number.isFinite(now);
  setHidden(node, !has);
  setText(node, has ? formatTimeLeft(deadline - now) : "");
}
