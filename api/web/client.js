// @ts-self-types="./client.d.ts"
// Relay browser client: an ES module, no dependencies, no build step. Its
// TypeScript types are client.d.ts, served beside it at /client.d.ts (the
// line above points Deno there); package.json makes this folder a package
// to vendor (README.md › Clients).
//
//   import { Relay } from "/client.js";
//   const relay = new Relay({ url: location.origin, publicKey: "pk_live_…" });
//   const sub = relay.subscribe("room:1", { onMessage: m => console.log(m.payload) });
//
// It reconnects after an unexpected close (500 ms × 2^attempt, capped at
// maxReconnectDelayMs, ±50 % jitter, reset after a healthy connection),
// re-sends every subscription with `since` = the last seq it saw on that
// channel, drops duplicates, reports replay gaps, and pings every
// heartbeatIntervalMs, closing a socket whose pong does not come back within
// heartbeatAckTimeoutMs. It offers no secret-key emit.

const DEFAULTS = {
  reconnect: true,
  maxReconnectDelayMs: 30000,
  heartbeatIntervalMs: 240000,
  heartbeatAckTimeoutMs: 15000,
};

const HEALTHY_MS = 5000; // a connection open this long resets the backoff
// Codes that answer a subscribe; the other channel-bound codes answer an emit
// (the server answers one connection's emits on a channel in order, so the
// oldest pending emit of that channel is the one answered), but
// too_many_channels, which answers a subscribe not yet acked, else an emit.
const SUBSCRIBE_ERRORS = new Set(["invalid_channel", "client_id_required", "invalid_since", "too_many_subscriptions",
  "client_id_too_long", "too_many_presence_members"]);

export function backoffDelay(attempt, maxMs, random = Math.random) {
  const base = Math.min(500 * 2 ** attempt, maxMs);
  return base * (0.5 + random());
}

export class Relay {
  constructor({ url = location.origin, publicKey, ...options }) {
    if (!publicKey) throw new Error("publicKey is required");
    this.options = { ...DEFAULTS, ...options };
    const u = new URL("/ws", url.replace(/^http/, "ws"));
    u.searchParams.set("publicKey", publicKey);
    this.url = u.toString();
    this.state = "closed";
    this.subs = new Map(); // channel → subscription
    this.pending = []; // { kind, channel, resolve, reject }
    this.listeners = { state: new Set(), error: new Set() };
    this.attempt = 0;
    this.closedByUser = false;
    this.connect();
  }

  on(event, fn) {
    this.listeners[event].add(fn);
    return () => this.listeners[event].delete(fn);
  }

  emitEvent(event, value) {
    for (const fn of this.listeners[event]) fn(value);
  }

  setState(state) {
    if (this.state === state) return;
    this.state = state;
    this.emitEvent("state", state);
  }

  connect() {
    this.setState(this.attempt === 0 ? "connecting" : "reconnecting");
    const ws = new WebSocket(this.url);
    this.ws = ws;
    ws.onopen = () => {
      this.openedAt = Date.now();
      this.setState("open");
      for (const sub of this.subs.values()) {
        sub.acked = false; // a new connection holds none of them yet
        sub.prev = undefined;
        this.sendSubscribe(sub);
      }
      this.startHeartbeat();
    };
    ws.onmessage = (e) => this.dispatch(e.data);
    ws.onclose = (e) => this.onClose(e);
    ws.onerror = () => {}; // onclose follows with the details
  }

  onClose(e) {
    this.stopHeartbeat();
    this.failPending("emit", "disconnected");
    this.ws = null;
    // 4004: the project is gone; 4001: the key was revoked, and a handshake
    // with it can only fail (a browser cannot see that 401).
    if (this.closedByUser || !this.options.reconnect || e.code === 4004 || e.code === 4001) {
      this.setState("closed");
      return;
    }
    if (this.openedAt && Date.now() - this.openedAt > HEALTHY_MS) this.attempt = 0;
    this.openedAt = 0;
    const delay = backoffDelay(this.attempt, this.options.maxReconnectDelayMs);
    this.attempt++;
    this.setState("reconnecting");
    this.reconnectTimer = setTimeout(() => this.connect(), delay);
  }

  startHeartbeat() {
    const { heartbeatIntervalMs, heartbeatAckTimeoutMs } = this.options;
    if (!heartbeatIntervalMs) return;
    this.heartbeat = setInterval(() => {
      if (!this.ws || this.ws.readyState !== WebSocket.OPEN || this.ackTimer) return; // a ping is out
      this.send({ action: "ping" });
      this.ackTimer = setTimeout(() => this.abandon(), heartbeatAckTimeoutMs);
    }, heartbeatIntervalMs);
  }

  // abandon gives up on a socket whose pong did not come back: a dead peer
  // would never finish the close handshake, so the client does not wait for
  // onclose and reconnects at once.
  abandon() {
    const ws = this.ws;
    if (!ws) return;
    ws.onclose = ws.onmessage = ws.onopen = null;
    try {
      ws.close(4000, "heartbeat timeout");
    } catch {}
    this.onClose({ code: 4000 });
  }

  stopHeartbeat() {
    clearInterval(this.heartbeat);
    clearTimeout(this.ackTimer);
    this.ackTimer = null;
  }

  send(obj) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) {
      this.ws.send(JSON.stringify(obj));
      return true;
    }
    return false;
  }

  sendSubscribe(sub) {
    const msg = { action: "subscribe", channel: sub.channel };
    if (sub.presence) Object.assign(msg, { presence: true, clientId: sub.clientId });
    if (sub.lastSeq !== undefined) msg.since = sub.lastSeq;
    this.send(msg);
  }

  // subscribe(channel, { presence, clientId, onMessage, onPresence, onGap, onError })
  // returns { channel, members, ready (a promise of the first ack), unsubscribe() }.
  subscribe(channel, opts = {}) {
    const sub = {
      channel,
      presence: !!opts.presence,
      clientId: opts.clientId,
      members: [],
      lastSeq: undefined,
      handlers: opts,
      unsubscribe: () => this.unsubscribe(channel),
    };
    sub.ready = new Promise((resolve, reject) => {
      sub.resolveReady = resolve;
      sub.rejectReady = reject;
    });
    sub.ready.catch(() => {});
    const prev = this.subs.get(channel);
    if (prev?.acked) sub.prev = prev; // kept by the server if it refuses this one
    this.subs.set(channel, sub);
    this.sendSubscribe(sub);
    return sub;
  }

  unsubscribe(channel) {
    if (!this.subs.delete(channel)) return;
    this.send({ action: "unsubscribe", channel });
  }

  // emit(channel, type, payload, token) resolves with the message's seq.
  emit(channel, type, payload, token) {
    return new Promise((resolve, reject) => {
      if (!this.send({ action: "emit", channel, type, payload, token })) {
        reject(new Error("not connected"));
        return;
      }
      this.pending.push({ kind: "emit", channel, resolve, reject });
    });
  }

  takePending(kind, channel) {
    const i = this.pending.findIndex((p) => p.kind === kind && p.channel === channel);
    return i < 0 ? null : this.pending.splice(i, 1)[0];
  }

  failPending(kind, reason) {
    this.pending = this.pending.filter((p) => {
      if (p.kind !== kind) return true;
      p.reject(new Error(reason));
      return false;
    });
  }

  dispatch(data) {
    let m;
    try {
      m = JSON.parse(data);
    } catch {
      return;
    }
    const sub = m.channel !== undefined ? this.subs.get(m.channel) : undefined;
    if (m.error) {
      const err = Object.assign(new Error(m.error), { code: m.error, channel: m.channel });
      const answersSubscribe = SUBSCRIBE_ERRORS.has(m.error) || (m.error === "too_many_channels" && !sub?.acked);
      if (sub && answersSubscribe) {
        if (!sub.acked) {
          // Refused: the server keeps an earlier subscription as it was, else
          // there is none (nor is it resent on reconnect).
          if (sub.prev) {
            if (sub.lastSeq !== undefined && (sub.prev.lastSeq === undefined || sub.lastSeq > sub.prev.lastSeq)) sub.prev.lastSeq = sub.lastSeq;
            this.subs.set(m.channel, sub.prev);
          } else this.subs.delete(m.channel);
        }
        sub.rejectReady(err);
        sub.handlers.onError?.(err);
      } else {
        const p = m.channel !== undefined && this.takePending("emit", m.channel);
        if (p) p.reject(err);
        else this.emitEvent("error", err);
      }
      return;
    }
    if (m.action === "pong") {
      clearTimeout(this.ackTimer);
      this.ackTimer = null;
      return;
    }
    if (m.action === "subscribe") {
      if (sub) sub.acked = true;
      sub?.resolveReady(sub);
      return;
    }
    if (m.action === "unsubscribe") return;
    if (m.action === "emit") {
      if (sub && (sub.lastSeq === undefined || m.seq > sub.lastSeq)) sub.lastSeq = m.seq;
      this.takePending("emit", m.channel)?.resolve(m.seq);
      return;
    }
    if (!sub) return;
    // A message has a seq; its type is the sender's, which may be "presence".
    if (typeof m.seq === "number") {
      if (sub.lastSeq !== undefined && m.seq <= sub.lastSeq) return; // seen before a reconnect
      sub.lastSeq = m.seq;
      sub.handlers.onMessage?.(m);
      return;
    }
    if (m.type === "presence") {
      if (m.event === "sync") sub.members = [...m.members];
      else if (m.event === "join") sub.members = [...sub.members, m.clientId];
      else if (m.event === "leave") sub.members = sub.members.filter((id) => id !== m.clientId);
      sub.handlers.onPresence?.({ ...m, members: [...sub.members] });
      return;
    }
    if (m.type === "replay_gap") sub.handlers.onGap?.(m);
  }

  close() {
    this.closedByUser = true;
    clearTimeout(this.reconnectTimer);
    this.stopHeartbeat();
    if (this.ws) this.ws.close(1000);
    else this.setState("closed");
  }
}
