// What survives a reload: drafts and the sends no ack has answered yet. The selectors are pure (the
// Node tests import them); `localStore` keeps their text in the browser's `localStorage`.

/**
 * The sends that must survive a reload: this page's runs that no ack has answered yet, in
 * send order. The page stores them; on load it puts them back with `send/request` (same
 * idempotency key, `restored: true`), so each goes out once when the socket is back.
 */
export function storedOutbox(state) {
  return Object.values(state.runs)
    .filter((r) => r.own && r.phase === "sending" && r.userText != null)
    .sort((a, b) => a.order - b.order)
    .map((r) => ({
      key: r.key,
      runId: r.id,
      text: r.userText,
      ...(r.attachments && r.attachments.length ? { attachments: r.attachments } : {}),
      ...(r.queueMode ? { queueMode: r.queueMode } : {}),
    }));
}

/** The drafts worth keeping across a reload (non-empty ones). */
export function storedDrafts(state) {
  const out = {};
  for (const [key, text] of Object.entries(state.drafts)) if (typeof text === "string" && text.trim()) out[key] = text;
  return out;
}

/**
 * Values kept in `localStorage` under `prefix` + name, as JSON. A value is written only when its
 * text changed; an empty one (`{}`, `[]`) removes the item. Storage that is disabled, full or damaged
 * leaves the page working, only without surviving a reload.
 */
export function localStore(prefix) {
  const written = new Map(); // name -> the text last written
  return {
    load(name, fallback) {
      try {
        const raw = localStorage.getItem(prefix + name);
        return raw ? JSON.parse(raw) : fallback;
      } catch {
        return fallback; // storage disabled or damaged: start empty
      }
    },
    save(name, value) {
      const text = JSON.stringify(value);
      if (written.get(name) === text) return;
      written.set(name, text);
      try {
        if (text === "{}" || text === "[]") localStorage.removeItem(prefix + name);
        else localStorage.setItem(prefix + name, text);
      } catch {
        // full or disabled: the page works, only without surviving a reload
      }
    },
  };
}

/** Write what survives a reload from `state` into `store` (a `localStore`): drafts and unsent messages. */
export function persist(store, state) {
  store.save("drafts", storedDrafts(state));
  store.save("outbox", storedOutbox(state)); // an item leaves once its ack arrived
}
