// The confirm / rename dialog (`<dialog>` of the page).

import { els } from "./view.js";

/**
 * Ask in the dialog: `title`, `text`, and with `input` (its first value) a text field named
 * `inputLabel`. Resolves with true (or the field's text) when confirmed, null when cancelled.
 */
export function ask({ title, text = "", input = null, inputLabel = "", confirm = "OK", danger = false }) {
  const d = els.dialog;
  els.dialogTitle.textContent = title;
  els.dialogText.textContent = text;
  els.dialogText.hidden = !text;
  els.dialogInput.hidden = input === null;
  els.dialogLabel.hidden = input === null;
  els.dialogLabel.textContent = inputLabel;
  els.dialogInput.value = input === null ? "" : input;
  els.dialogConfirm.textContent = confirm;
  d.dataset.danger = String(danger);
  d.returnValue = "";
  return new Promise((resolve) => {
    const onClose = () => {
      d.removeEventListener("close", onClose);
      const ok = d.returnValue === "ok";
      resolve(ok ? (input === null ? true : els.dialogInput.value) : null);
    };
    d.addEventListener("close", onClose);
    d.showModal();
    if (input !== null) {
      els.dialogInput.focus();
      els.dialogInput.select();
    } else {
      els.dialogConfirm.focus();
    }
  });
}
