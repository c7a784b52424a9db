// Unit tests of the chat page's small helpers (static/chat/util.js): the "one in flight, run
// again after" guard and the keyed list update (with a tiny fake DOM: only what it touches).

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { coalesce, updateKeyed } from "../../static/chat/util.js";

function deferred() {
  let resolve;
  let reject;
  const promise = new Promise((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

const settle = () => new Promise((resolve) => setImmediate(resolve));

describe("coalesce", () => {
  test("a call while one is in flight runs once more after it, however many came", async () => {
    const calls = [];
    const pending = [];
    const run = coalesce((arg) => {
      calls.push(arg);
      const d = deferred();
      pending.push(d);
      return d.promise;
    });
    run("a");
    run("b");
    run("c");
    assert.deepEqual(calls, ["a"]);
    assert.equal(run.busy(), true);
    pending[0].resolve();
    await settle();
    assert.deepEqual(calls, ["a", "a"], "the run again uses the first call's arguments");
    pending[1].resolve();
    await settle();
    assert.deepEqual(calls, ["a", "a"]);
    assert.equal(run.busy(), false);
  });

  test("without again, a call while one is in flight is dropped", async () => {
    let count = 0;
    const d = deferred();
    const run = coalesce(
      () => {
        count += 1;
        return d.promise;
      },
      { again: false },
    );
    run();
    run();
    d.resolve();
    await settle();
    assert.equal(count, 1);
    assert.equal(run.busy(), false);
    run();
    assert.equal(count, 2);
  });

  test("one slot per key", async () => {
    const calls = [];
    const pending = new Map();
    const run = coalesce(
      (key) => {
        calls.push(key);
        const d = deferred();
        pending.set(key, d);
        return d.promise;
      },
      { keyOf: (key) => key },
    );
    run("x");
    run("y");
    run("x");
    assert.deepEqual(calls, ["x", "y"]);
    assert.equal(run.busy("x"), true);
    pending.get("y").resolve();
    await settle();
    assert.deepEqual(calls, ["x", "y"]);
    assert.equal(run.busy("y"), false);
    pending.get("x").resolve();
    await settle();
    assert.deepEqual(calls, ["x", "y", "x"]);
  });

  test("a call that starts nothing (no promise) leaves the slot free at once", () => {
    let ready = false;
    let count = 0;
    const run = coalesce(() => {
      count += 1;
      return ready ? new Promise(() => {}) : null;
    });
    run();
    assert.equal(run.busy(), false);
    run();
    assert.equal(count, 2);
    ready = true;
    run();
    run();
    assert.equal(count, 3);
    assert.equal(run.busy(), true);
  });

  test("a rejected call frees the slot and still runs again", async () => {
    const pending = [];
    const run = coalesce(() => {
      const d = deferred();
      pending.push(d);
      return d.promise;
    });
    run();
    run();
    pending[0].reject(new Error("gone"));
    await settle();
    assert.equal(pending.length, 2);
    pending[1].resolve();
    await settle();
    assert.equal(run.busy(), false);
  });

  test("a call that throws frees the slot and throws", () => {
    const run = coalesce(() => {
      throw new Error("fault");
    });
    assert.throws(() => run(), /fault/);
    assert.equal(run.busy(), false);
  });

  test("a call made by fn itself, before it returns, runs again after", async () => {
    let count = 0;
    const pending = [];
    const run = coalesce(() => {
      count += 1;
      if (count === 1) run(); // e.g. a dispatch whose effect asks for the same request
      const d = deferred();
      pending.push(d);
      return d.promise;
    });
    run();
    assert.equal(count, 1);
    pending[0].resolve();
    await settle();
    assert.equal(count, 2);
  });
});

// Just enough of a DOM for updateKeyed: a parent with ordered children.
class FakeNode {
  constructor(name) {
    this.name = name;
    this.parent = null;
    this.children = [];
    this.moves = 0;
  }
  get firstChild() {
    return this.children[0] || null;
  }
  get nextSibling() {
    if (!this.parent) return null;
    const siblings = this.parent.children;
    return siblings[siblings.indexOf(this) + 1] || null;
  }
  insertBefore(node, ref) {
    if (node.parent) node.remove();
    const at = ref ? this.children.indexOf(ref) : this.children.length;
    assert.ok(at >= 0, "the reference node is a child");
    this.children.splice(at, 0, node);
    node.parent = this;
    node.moves += 1;
    return node;
  }
  remove() {
    if (!this.parent) return;
    this.parent.children.splice(this.parent.children.indexOf(this), 1);
    this.parent = null;
  }
}

describe("updateKeyed", () => {
  function setup() {
    const container = new FakeNode("list");
    const elements = new Map();
    const created = [];
    const updated = [];
    const apply = (items) =>
      updateKeyed(
        container,
        elements,
        items,
        (item) => item.id,
        (item) => {
          created.push(item.id);
          return new FakeNode(item.id);
        },
        (el, item) => {
          el.text = item.text;
          updated.push(item.id);
        },
      );
    const names = () => container.children.map((n) => n.name);
    return { container, elements, created, updated, apply, names };
  }

  test("creates missing elements in order and updates each", () => {
    const t = setup();
    t.apply([{ id: "a", text: "1" }, { id: "b", text: "2" }]);
    assert.deepEqual(t.names(), ["a", "b"]);
    assert.deepEqual(t.created, ["a", "b"]);
    assert.deepEqual(t.updated, ["a", "b"]);
    assert.equal(t.container.children[1].text, "2");
    assert.deepEqual([...t.elements.keys()], ["a", "b"]);
  });

  test("reuses elements by key and moves only what is out of place", () => {
    const t = setup();
    t.apply([{ id: "a" }, { id: "b" }, { id: "c" }]);
    const [a, b, c] = t.container.children;
    t.apply([{ id: "a", text: "new" }, { id: "b" }, { id: "c" }]);
    assert.deepEqual(t.created, ["a", "b", "c"], "nothing made twice");
    assert.equal(t.container.children[0], a);
    assert.equal(a.text, "new");
    assert.deepEqual([a.moves, b.moves, c.moves], [1, 1, 1], "in place: not moved");
    t.apply([{ id: "c" }, { id: "a" }, { id: "b" }]);
    assert.deepEqual(t.names(), ["c", "a", "b"]);
    assert.deepEqual([a.moves, b.moves, c.moves], [1, 1, 2], "one move puts c first");
  });

  test("inserts new keys in between and at the front", () => {
    const t = setup();
    t.apply([{ id: "b" }, { id: "d" }]);
    t.apply([{ id: "a" }, { id: "b" }, { id: "c" }, { id: "d" }]);
    assert.deepEqual(t.names(), ["a", "b", "c", "d"]);
  });

  test("removes elements whose key is gone, from the container and the map", () => {
    const t = setup();
    t.apply([{ id: "a" }, { id: "b" }, { id: "c" }]);
    const b = t.container.children[1];
    t.apply([{ id: "a" }, { id: "c" }]);
    assert.deepEqual(t.names(), ["a", "c"]);
    assert.equal(b.parent, null);
    assert.deepEqual([...t.elements.keys()], ["a", "c"]);
    t.apply([]);
    assert.deepEqual(t.names(), []);
    assert.equal(t.elements.size, 0);
  });

  test("children that are not in the map stay after the keyed ones", () => {
    const t = setup();
    const other = new FakeNode("other");
    t.container.insertBefore(other, null);
    t.apply([{ id: "a" }, { id: "b" }]);
    assert.deepEqual(t.names(), ["a", "b", "other"]);
    t.apply([{ id: "b" }]);
    assert.deepEqual(t.names(), ["b", "other"]);
  });
});
