// The API keys page (templates/chat/keys.html): copy a new key, confirm a revoke, send the create
// form once. The page works without it (its forms post as they are); the Node unit tests
// (tests/js/keys.test.mjs) drive these functions with small fakes of the few DOM parts they touch.

/** The question asked before revoking the key `name` (its printed `prefix`). */
export function revokeQuestion(name, prefix) {
  const label = name ? `“${name}” (${prefix}…)` : `${prefix}…`;
  return {
    title: "Revoke this key?",
    text: `${label} stops working at once and the clients using it are disconnected. This cannot be undone.`,
    confirm: "Revoke",
  };
}

/**
 * Copy `text` to `clipboard` (the async Clipboard API, or nothing where the page is not a secure
 * context). Resolves with what to tell the user, and whether it was copied.
 */
export async function copyKey(text, clipboard) {
  try {
    if (!clipboard || typeof clipboard.writeText !== "function") throw new Error("no clipboard");
    await clipboard.writeText(text);
    return { ok: true, status: "Copied. Keep it somewhere safe." };
  } catch {
    return { ok: false, status: "Could not copy: the key is selected, press Ctrl+C (⌘C) to copy it." };
  }
}

/**
 * Ask `question` ({title, text, confirm}) in `dialog`, a `<dialog>` whose form has a title (h2), a
 * text (p) and buttons of value "ok" and "cancel". Resolves true when confirmed.
 */
export function ask(dialog, question) {
  dialog.querySelector("h2").textContent = question.title;
  dialog.querySelector("p").textContent = question.text;
  dialog.querySelector('button[value="ok"]').textContent = question.confirm;
  dialog.returnValue = "";
  return new Promise((resolve) => {
    const onClose = () => {
      dialog.removeEventListener("close", onClose);
      resolve(dialog.returnValue === "ok");
    };
    dialog.addEventListener("close", onClose);
    dialog.showModal();
  });
}

/** A revoke form's submit: asked first; sent (without asking again) only when confirmed. */
export async function confirmRevoke(form, dialog, event) {
  event.preventDefault();
  const question = revokeQuestion(form.dataset.name || "", form.dataset.prefix || "");
  if (await ask(dialog, question)) form.submit(); // submit() fires no submit event: no second question
}

/** Wire the page in `doc`; `clipboard` is the browser's (navigator.clipboard). */
export function start(doc, clipboard) {
  const dialog = doc.getElementById("keys-dialog");
  for (const button of doc.querySelectorAll("[data-copy]")) {
    const input = doc.getElementById(button.dataset.copy);
    const status = doc.querySelector('[data-testid="copy-status"]');
    button.addEventListener("click", async () => {
      const result = await copyKey(input.value, clipboard);
      if (!result.ok) input.select();
      status.textContent = result.status;
    });
  }
  for (const form of doc.querySelectorAll("form[data-revoke]")) {
    form.addEventListener("submit", (event) => confirmRevoke(form, dialog, event));
  }
  const create = doc.querySelector('[data-testid="key-form"]');
  create?.addEventListener("submit", () => {
    // One key per click: a second click while the first post is on its way would make another.
    const button = create.querySelector('button[type="submit"]');
    setTimeout(() => {
      button.disabled = true;
    }, 0);
  });
}

if (globalThis.document?.getElementById("keys")) start(document, globalThis.navigator?.clipboard);
