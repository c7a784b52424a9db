// Small helpers of the chat page that need no browser: the Node unit tests
// (tests/js/util.test.mjs) import this file too. No state, no I/O of their own.

/**
 * One call of `fn` in flight at a time, per `keyOf(...args)` (one slot when there is no `keyOf`).
 *
 * `fn` returns a promise while its work is in flight, or anything else when it did not start
 * any (a precondition failed): then the slot is free again at once. A call that comes while the
 * slot is busy starts nothing: with `again` (the default) `fn` runs once more, with the same
 * arguments, after the running call settles (however many calls came meanwhile); without it,
 * the call is dropped.
 *
 * @template {unknown[]} A
 * @param {(...args: A) => unknown} fn
 * @param {{ again?: boolean, keyOf?: (...args: A) => unknown }} [options]
 * @returns {((...args: A) => void) & { busy: (...args: A) => boolean }}
 */
export function coalesce(fn, { again = true, keyOf = () => null } = {}) {
  const inFlight = new Map(); // key -> { again }
  const run = (...args) => {
    const key = keyOf(...args);
    const running = inFlight.get(key);
    if (running) {
      if (again) running.again = true;
      return;
    }
    const marker = { again: false };
    inFlight.set(key, marker);
    let result;
    try {
      result = fn(...args);
    } catch (error) {
      inFlight.delete(key);
      throw error;
    }
    if (!result || typeof result.then !== "function") {
      inFlight.delete(key); // nothing started
      return;
    }
    const settled = () => {
      inFlight.delete(key);
      if (marker.again) run(...args);
    };
    result.then(settled, settled);
  };
  run.busy = (...args) => inFlight.has(keyOf(...args));
  return run;
}

/**
 * Make `container`'s children the elements for `items`, in order, reusing the element kept
 * in `elements` (a Map: key -> element) for each key: `create(item)` makes a missing one,
 * `update(el, item)` brings it up to date. Elements are moved only when out of place; those
 * whose key is no longer among the items are removed (from the container and the map).
 *
 * Needs only `firstChild`, `nextSibling`, `insertBefore` and `remove` of the DOM.
 */
export function updateKeyed(container, elements, items, keyOf, create, update) {
  const seen = new Set();
  let prev = null;
  for (const item of items) {
    const key = keyOf(item);
    let el = elements.get(key);
    if (!el) {
      el = create(item);
      elements.set(key, el);
    }
    update(el, item);
    const expected = prev ? prev.nextSibling : container.firstChild;
    if (el !== expected) container.insertBefore(el, expected);
    prev = el;
    seen.add(key);
  }
  for (const [key, el] of elements) {
    if (!seen.has(key)) {
      el.remove();
      elements.delete(key);
    }
  }
}
