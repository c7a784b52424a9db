// Unit tests of the API keys page's module (static/chat/keys.js): the revoke question and its
// dialog, copying a new key (and what the user is told when the clipboard refuses), and the page's
// wiring, against small fakes of the few DOM parts it touches.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { ask, confirmRevoke, copyKey, revokeQuestion, start } from "../../static/chat/keys.js";

class FakeElement {
  constructor(props = {}) {
    this.textContent = "";
    this.dataset = {};
    this.listeners = {};
    Object.assign(this, props);
  }

  addEventListener(type, fn) {
    (this.listeners[type] ||= []).push(fn);
  }

  removeEventListener(type, fn) {
    this.listeners[type] = (this.listeners[type] || []).filter((f) => f !== fn);
  }

  /** Run the listeners of `type`; resolves when the async ones are done. */
  fire(type, event = {}) {
    return Promise.all((this.listeners[type] || []).slice().map((fn) => fn(event)));
  }
}

/** A `<dialog>` with its title, text and OK button; `answer(value)` closes it as a button would. */
function fakeDialog() {
  const parts = { h2: new FakeElement(), p: new FakeElement(), 'button[value="ok"]': new FakeElement() };
  const dialog = new FakeElement({ returnValue: "x", opened: 0 });
  dialog.querySelector = (selector) => parts[selector];
  dialog.showModal = () => {
    dialog.opened += 1;
  };
  dialog.answer = (value) => {
    dialog.returnValue = value;
    dialog.fire("close");
  };
  dialog.parts = parts;
  return dialog;
}

function fakeForm(dataset) {
  const form = new FakeElement({ submitted: 0 });
  form.dataset = dataset;
  form.submit = () => {
    form.submitted += 1;
  };
  return form;
}

function fakeEvent() {
  return {
    prevented: false,
    preventDefault() {
      this.prevented = true;
    },
  };
}

const nextTask = () => new Promise((resolve) => setTimeout(resolve, 0));

describe("revokeQuestion", () => {
  test("names the key by its name and prefix, and says what revoking does", () => {
    const q = revokeQuestion("laptop", "agt_AbC12345");
    assert.equal(q.title, "Revoke this key?");
    assert.match(q.text, /^“laptop” \(agt_AbC12345…\) stops working at once/);
    assert.match(q.text, /disconnected/);
    assert.equal(q.confirm, "Revoke");
  });

  test("a key without a name is named by its prefix alone", () => {
    assert.match(revokeQuestion("", "agt_x").text, /^agt_x… stops working/);
  });
});

describe("ask", () => {
  test("shows the question and resolves true for OK, false for Cancel or Escape", async () => {
    const dialog = fakeDialog();
    const asked = ask(dialog, { title: "T?", text: "what happens", confirm: "Do it" });
    assert.equal(dialog.opened, 1);
    assert.equal(dialog.parts.h2.textContent, "T?");
    assert.equal(dialog.parts.p.textContent, "what happens");
    assert.equal(dialog.parts['button[value="ok"]'].textContent, "Do it");
    assert.equal(dialog.returnValue, "", "a stale answer from before is cleared");
    dialog.answer("ok");
    assert.equal(await asked, true);
    for (const value of ["cancel", ""]) {
      const again = ask(dialog, revokeQuestion("a", "b"));
      dialog.answer(value);
      assert.equal(await again, false);
    }
    assert.deepEqual(dialog.listeners.close, [], "each question removes its listener");
  });
});

describe("confirmRevoke", () => {
  test("the form is sent only after OK, and never by the submit event itself", async () => {
    const dialog = fakeDialog();
    const form = fakeForm({ name: "ci", prefix: "agt_1" });
    const cancelled = fakeEvent();
    const first = confirmRevoke(form, dialog, cancelled);
    assert.equal(cancelled.prevented, true);
    assert.match(dialog.parts.p.textContent, /“ci” \(agt_1…\)/);
    dialog.answer("cancel");
    await first;
    assert.equal(form.submitted, 0);
    const confirmed = fakeEvent();
    const second = confirmRevoke(form, dialog, confirmed);
    dialog.answer("ok");
    await second;
    assert.equal(confirmed.prevented, true);
    assert.equal(form.submitted, 1);
  });
});

describe("copyKey", () => {
  test("copies the key and says so", async () => {
    const written = [];
    const result = await copyKey("agt_secret", { writeText: async (text) => written.push(text) });
    assert.deepEqual(written, ["agt_secret"]);
    assert.equal(result.ok, true);
    assert.match(result.status, /^Copied/);
  });

  test("a refused or missing clipboard tells the user how to copy it themselves", async () => {
    const refused = await copyKey("agt_secret", {
      writeText: async () => {
        throw new Error("NotAllowedError");
      },
    });
    for (const result of [refused, await copyKey("agt_secret", undefined), await copyKey("k", {})]) {
      assert.equal(result.ok, false);
      assert.match(result.status, /press Ctrl\+C/);
    }
  });
});

describe("start", () => {
  function fakePage() {
    const input = new FakeElement({ value: "agt_new", selected: 0 });
    input.select = () => {
      input.selected += 1;
    };
    const copy = new FakeElement();
    copy.dataset = { copy: "new-key-value" };
    const status = new FakeElement();
    const dialog = fakeDialog();
    const revoke = fakeForm({ name: "old", prefix: "agt_old" });
    const button = new FakeElement({ disabled: false });
    const create = new FakeElement();
    create.querySelector = () => button;
    const byId = { "keys-dialog": dialog, "new-key-value": input };
    const doc = {
      getElementById: (id) => byId[id],
      querySelectorAll: (selector) => ({ "[data-copy]": [copy], "form[data-revoke]": [revoke] })[selector] || [],
      querySelector: (selector) =>
        ({ '[data-testid="copy-status"]': status, '[data-testid="key-form"]': create })[selector] || null,
    };
    return { doc, input, copy, status, dialog, revoke, create, button };
  }

  test("Copy copies the new key; when it cannot, the key is selected for the user", async () => {
    const written = [];
    const page = fakePage();
    start(page.doc, { writeText: async (text) => written.push(text) });
    await page.copy.fire("click");
    assert.deepEqual(written, ["agt_new"]);
    assert.match(page.status.textContent, /^Copied/);
    assert.equal(page.input.selected, 0);

    const refused = fakePage();
    start(refused.doc, undefined);
    await refused.copy.fire("click");
    assert.equal(refused.input.selected, 1);
    assert.match(refused.status.textContent, /Could not copy/);
  });

  test("a revoke form asks first; the create form is sent once", async () => {
    const page = fakePage();
    start(page.doc, undefined);
    const event = fakeEvent();
    const submitting = page.revoke.fire("submit", event);
    assert.equal(event.prevented, true);
    assert.equal(page.dialog.opened, 1);
    page.dialog.answer("ok");
    await submitting;
    assert.equal(page.revoke.submitted, 1);

    await page.create.fire("submit", fakeEvent());
    assert.equal(page.button.disabled, false, "not before the browser has taken the click");
    await nextTask();
    assert.equal(page.button.disabled, true);
  });
});
