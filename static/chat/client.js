// One protocol v4 WebSocket with handshake, request/response matching, a tick
// watchdog and reconnect with backoff. It knows nothing of chat state: frames go
// to the callbacks, and the page's state module decides what they mean.

export const PROTOCOL_VERSION = 4;

/**
 * Scopes the page asks for in `connect`. Requested scopes are intersected with what the user may
 * have (admin only for staff), so this is what a browser session got before plus
 * `operator.approvals` (TOOLS.md §13.5), which is granted only to a client that asks for it.
 */
export const DEFAULT_SCOPES = Object.freeze(["operator.read", "operator.write", "operator.admin", "operator.approvals"]);
/** Capabilities declared in `connect`: `tool-events` gets the `agent` events of tool calls (§13.3). */
export const DEFAULT_CAPS = Object.freeze(["tool-events"]);

/** Delay before reconnect attempt `attempt` (0-based): exponential, capped, with jitter. */
export function backoffDelay(attempt, { baseMs = 300, maxMs = 5000, random = Math.random } = {}) {
  const raw = Math.min(maxMs, baseMs * 2 ** Math.min(attempt, 10));
  return Math.round(raw * (0.75 + random() * 0.5));
}

/** A request that got no answer: DISCONNECTED (no connection, or it closed first) or TIMEOUT. */
export class RequestError extends Error {
  /**
   * @param {string} code DISCONNECTED or TIMEOUT
   * @param {string} message
   * @param {{sent?: boolean, timeoutMs?: number|null}} [info] whether the request went out (then it may have
   *   taken effect), and the timeout it ran into
   */
  constructor(code, message, { sent = false, timeoutMs = null } = {}) {
    super(message);
    this.name = "RequestError";
    this.code = code;
    this.sent = sent;
    this.timeoutMs = timeoutMs;
  }
}

export class GatewayClient {
  /**
   * @param {object} opts
   * @param {string} opts.url WebSocket URL of the gateway
   * @param {object} [opts.client] client block of `connect`
   * @param {string[]} [opts.scopes] scopes asked for in `connect` (default: DEFAULT_SCOPES)
   * @param {string[]} [opts.caps] capabilities declared in `connect` (default: DEFAULT_CAPS)
   * @param {(frame: object) => void} [opts.onEvent] every event frame, in order
   * @param {(hello: object) => void} [opts.onReady] handshake done
   * @param {() => void} [opts.onOpen] socket open (before the handshake)
   * @param {() => void} [opts.onConnecting] a connection attempt starts
   * @param {(info: {code: number, retryInMs: number|null}) => void} [opts.onClosed] socket gone
   * @param {(error: object) => void} [opts.onFatal] handshake refused for good (auth, version)
   * @param {{baseMs?: number, maxMs?: number}} [opts.backoff] reconnect delays
   * @param {Function} [opts.WebSocketImpl] WebSocket constructor (tests pass a fake)
   */
  constructor(opts) {
    this.opts = opts;
    this.ws = null;
    this.gen = 0;
    this.ready = false;
    this.stopped = false;
    this.attempt = 0;
    this.pending = new Map();
    this.nextId = 1;
    this.retryTimer = null;
    this.watchdog = null;
    this.lastFrameAt = 0;
    this.tickMs = 30000;
    this.openedAt = 0;
    this.closedGen = 0;
  }

  start() {
    this.stopped = false;
    this._open();
    this.watchdog = setInterval(() => this._checkAlive(), 2000);
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.retryTimer);
    clearInterval(this.watchdog);
    if (this.ws) this.ws.close(1000, "bye");
  }

  /** Reconnect now (e.g. the browser came back online) instead of waiting for the backoff. */
  reconnectNow() {
    // Nothing to do while an attempt is under way: connecting, or open and handshaking (the
    // watchdog drops a handshake that hangs). Opening a second socket would leave this one open.
    if (this.stopped || this.ready) return;
    if (this.ws && (this.ws.readyState === 0 || this.ws.readyState === 1)) return;
    clearTimeout(this.retryTimer);
    this._open();
  }

  /**
   * Send a request; resolves with the response frame ({ok, payload, error}) whatever `ok` is.
   * Rejects with RequestError DISCONNECTED when the socket is not ready or closes first, and
   * TIMEOUT when no answer comes within `timeoutMs`.
   */
  request(method, params = {}, timeoutMs = 30000) {
    if (!this.ready || !this.ws) return Promise.reject(new RequestError("DISCONNECTED", "not connected"));
    return this._send(method, params, timeoutMs);
  }

  _send(method, params, timeoutMs) {
    const id = `c${this.gen}-${this.nextId++}`;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new RequestError("TIMEOUT", `no response to ${method}`, { sent: true, timeoutMs }));
      }, timeoutMs);
      this.pending.set(id, { resolve, reject, timer });
      try {
        this.ws.send(JSON.stringify({ type: "req", id, method, params }));
      } catch (err) {
        clearTimeout(timer);
        this.pending.delete(id);
        reject(new RequestError("DISCONNECTED", String(err)));
      }
    });
  }

  _open() {
    const Impl = this.opts.WebSocketImpl || WebSocket;
    this.gen += 1;
    const gen = this.gen;
    this.ready = false;
    this.openedAt = Date.now();
    this.opts.onConnecting && this.opts.onConnecting();
    let ws;
    try {
      ws = new Impl(this.opts.url);
    } catch (err) {
      this._closed(gen, 0);
      return;
    }
    this.ws = ws;
    ws.onopen = () => {
      if (gen !== this.gen) return;
      this.lastFrameAt = Date.now();
      this.opts.onOpen && this.opts.onOpen();
    };
    ws.onmessage = (msg) => {
      if (gen !== this.gen) return;
      this.lastFrameAt = Date.now();
      let frame;
      try {
        frame = JSON.parse(msg.data);
      } catch {
        return;
      }
      this._frame(frame, gen);
    };
    ws.onclose = (ev) => this._closed(gen, ev.code);
    ws.onerror = () => {}; // onclose follows
  }

  _frame(frame, gen) {
    if (frame.type === "res") {
      const waiter = this.pending.get(frame.id);
      if (waiter) {
        this.pending.delete(frame.id);
        clearTimeout(waiter.timer);
        waiter.resolve(frame);
      }
      return;
    }
    if (frame.type !== "event") return;
    this.opts.onEvent && this.opts.onEvent(frame);
    if (frame.event === "connect.challenge" && !this.ready) this._handshake(gen);
  }

  async _handshake(gen) {
    const params = {
      minProtocol: PROTOCOL_VERSION,
      maxProtocol: PROTOCOL_VERSION,
      client: this.opts.client || { id: "agentgate-web", version: "1", platform: "web", mode: "webchat" },
      role: "operator",
      scopes: [...(this.opts.scopes || DEFAULT_SCOPES)],
      caps: [...(this.opts.caps || DEFAULT_CAPS)],
    };
    let res;
    try {
      res = await this._send("connect", params, 15000);
    } catch {
      return; // closed meanwhile; reconnect follows
    }
    if (gen !== this.gen) return;
    if (!res.ok) {
      const error = res.error || { code: "INTERNAL", message: "handshake failed" };
      if (error.code === "UNAUTHORIZED" || (error.details && error.details.code === "PROTOCOL_MISMATCH")) {
        this.stopped = true;
        this.opts.onFatal && this.opts.onFatal(error);
      }
      return;
    }
    const hello = res.payload || {};
    this.tickMs = (hello.policy && hello.policy.tickIntervalMs) || 30000;
    this.ready = true;
    this.attempt = 0;
    this.opts.onReady && this.opts.onReady(hello);
  }

  _closed(gen, code) {
    if (gen !== this.gen || this.closedGen === gen) return;
    this.closedGen = gen;
    this.ready = false;
    this.ws = null;
    for (const [id, waiter] of this.pending) {
      clearTimeout(waiter.timer);
      waiter.reject(new RequestError("DISCONNECTED", "connection closed", { sent: true }));
      this.pending.delete(id);
    }
    let retryInMs = null;
    if (!this.stopped) {
      retryInMs = backoffDelay(this.attempt, this.opts.backoff);
      this.attempt += 1;
      clearTimeout(this.retryTimer);
      this.retryTimer = setTimeout(() => this._open(), retryInMs);
    }
    this.opts.onClosed && this.opts.onClosed({ code, retryInMs });
  }

  _checkAlive() {
    if (!this.ws) return;
    const now = Date.now();
    if (!this.ready) {
      // Opened but no hello in time: drop it and try again.
      if (now - this.openedAt > 15000) this._drop("handshake timeout");
      return;
    }
    // No frame (not even a tick) for two tick intervals: the link is dead (close code 4000, §1).
    if (now - this.lastFrameAt > 2 * this.tickMs + 5000) this._drop("tick timeout");
  }

  _drop(reason) {
    const gen = this.gen;
    try {
      this.ws.close(4000, reason);
    } catch {
      // already closing
    }
    this._closed(gen, 4000); // do not wait for a dead link's closing handshake
  }
}
