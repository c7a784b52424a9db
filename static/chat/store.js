// The page's store: the reducer's state (state.js), changed only by `dispatch` and read everywhere,
// and the render that follows a batch of changes. app.js starts it with what carries out the
// reducer's effects, what stores the state, and what draws it, so no module below needs those.

import { reduce } from "./state.js";

/** The reducer's state; only `dispatch` replaces it. */
export let state = null;

const hooks = { runEffect: () => {}, persist: () => {}, render: () => {} };
let renderPending = false; // a render is scheduled (one microtask for a batch of dispatches)

/**
 * Start with state `initial`. `runEffect(eff)` carries out one of the reducer's effects,
 * `persist(state)` stores what survives a reload, `render()` draws the page.
 */
export function startStore(initial, { runEffect, persist, render }) {
  state = initial;
  Object.assign(hooks, { runEffect, persist, render });
}

/** Every state change goes through here: the reducer, its effects, storage, then a render. */
export function dispatch(action) {
  state = reduce(state, action);
  const effects = state.effects;
  for (const eff of effects) hooks.runEffect(eff);
  hooks.persist(state);
  scheduleRender();
}

/** Draw the page once the current batch of changes is done. */
export function scheduleRender() {
  if (renderPending) return;
  renderPending = true;
  Promise.resolve().then(() => {
    renderPending = false;
    hooks.render();
  });
}
