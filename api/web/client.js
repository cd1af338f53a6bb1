// @ts-self-types="./client.d.ts"
// Relay browser client: an ES module, no dependencies, no build step. Its
// TypeScript types are client.d.ts, served beside it at /client.d.ts (the
// line above points Deno there); package.json makes this folder a package
// to vendor (api/web/README.md).
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
//
// Channel authorization (proto/PROTOCOL.md): with the option token, a
// callback giving a connection token (from the page's backend), every connect
// asks it for a fresh one and sends it as ?token=; the client refreshes it on
// the socket ~30 s before its exp (or when the server says token_expiring)
// and reconnects at once, with since, after a close 4011 or a refused
// refresh. subscribe(channel, { token }) sends a subscribe token got from its
// callback with every (re)subscribe of that channel.
//
// Resuming across page loads (opt-in): with resume: true the client keeps
// each channel's last seq in localStorage (resume: { storage } for another
// Storage), and a later page's subscribe to that channel starts with since =
// that seq: what came meanwhile is replayed (or a replay_gap says what
// cannot be). subscribe(channel, { since }) sets the starting seq by hand.

const DEFAULTS = {
  reconnect: true,
  maxReconnectDelayMs: 30000,
  heartbeatIntervalMs: 240000,
  heartbeatAckTimeoutMs: 15000,
};

const HEALTHY_MS = 5000; // a connection open this long resets the backoff
const REFRESH_LEAD_MS = 30000; // refresh the connection token this long before its exp
const CLOSE_TOKEN_EXPIRED = 4011;
// Codes that answer a subscribe; the other channel-bound codes answer an emit
// (the server answers one connection's emits on a channel in order, so the
// oldest pending emit of that channel is the one answered), but
// too_many_channels, which answers a subscribe not yet acked, else an emit.
const SUBSCRIBE_ERRORS = new Set(["invalid_channel", "client_id_required", "invalid_since", "too_many_subscriptions",
  "client_id_too_long", "too_many_presence_members", "token_required", "client_id_mismatch", "channel_forbidden",
  "invalid_subscribe_token"]);

// tokenExp is the exp of a JWT's payload in ms (not verified: only to know
// when to refresh), or undefined.
function tokenExp(token) {
  try {
    const b64 = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    const exp = JSON.parse(atob(b64 + "=".repeat((4 - (b64.length % 4)) % 4))).exp;
    return typeof exp === "number" ? exp * 1000 : undefined;
  } catch {
    return undefined;
  }
}

// callToken calls a token callback; a callback that throws, rejects or gives
// no string fails with code token_unavailable (the cause kept).
async function callToken(fn, channel) {
  let token, cause;
  try {
    token = await fn();
  } catch (e) {
    cause = e;
  }
  if (typeof token === "string" && token !== "") return token;
  throw Object.assign(new Error("token_unavailable"), { code: "token_unavailable", channel, cause });
}

// resumeStore keeps each channel's last seq in storage (getItem, setItem)
// under "relay:<publicKey>:<channel>", for resume; undefined when off. Saves
// are gathered for RESUME_SAVE_MS and written then, when the page is hidden
// or left (pagehide), and at close().
const RESUME_SAVE_MS = 250;

function resumeStore(option, publicKey) {
  if (!option) return undefined;
  const storage = option === true ? globalThis.localStorage : option.storage;
  if (!storage) return undefined;
  const prefix = "relay:" + publicKey + ":";
  const dirty = new Map(); // channel → seq not yet written
  let timer;
  const flush = () => {
    clearTimeout(timer);
    timer = undefined;
    for (const [channel, seq] of dirty) {
      try {
        storage.setItem(prefix + channel, String(seq));
      } catch {} // full or denied: the page resumes from an older seq, or none
    }
    dirty.clear();
  };
  const onHidden = () => document.visibilityState === "hidden" && flush();
  globalThis.addEventListener?.("pagehide", flush);
  globalThis.document?.addEventListener?.("visibilitychange", onHidden);
  return {
    load(channel) {
      if (dirty.has(channel)) return dirty.get(channel);
      let v = null;
      try {
        v = storage.getItem(prefix + channel);
      } catch {}
      const seq = v === null ? NaN : Number(v);
      return Number.isSafeInteger(seq) && seq >= 0 ? seq : undefined;
    },
    save(channel, seq) {
      dirty.set(channel, seq);
      if (timer === undefined) timer = setTimeout(flush, RESUME_SAVE_MS);
    },
    // close writes what is pending and stops listening to the page.
    close() {
      flush();
      globalThis.removeEventListener?.("pagehide", flush);
      globalThis.document?.removeEventListener?.("visibilitychange", onHidden);
    },
  };
}

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
    this.resume = resumeStore(this.options.resume, publicKey);
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

  // seen records seq as sub's last (and stores it, with resume).
  seen(sub, seq) {
    sub.lastSeq = seq;
    this.resume?.save(sub.channel, seq);
  }

  setState(state) {
    if (this.state === state) return;
    this.state = state;
    this.emitEvent("state", state);
  }

  connect() {
    this.setState(this.attempt === 0 && this.state !== "reconnecting" ? "connecting" : "reconnecting");
    if (!this.options.token) {
      this.open(this.url);
      return;
    }
    const gen = (this.gen = (this.gen || 0) + 1);
    callToken(this.options.token).then(
      (token) => {
        if (this.closedByUser || gen !== this.gen) return;
        this.tokenExp = tokenExp(token);
        this.open(this.url + "&token=" + encodeURIComponent(token));
      },
      (err) => {
        if (this.closedByUser || gen !== this.gen) return;
        this.emitEvent("error", err);
        this.onClose({ code: 0 }); // as a failed connect: backoff, then ask again
      },
    );
  }

  open(url) {
    const ws = new WebSocket(url);
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
      this.scheduleRefresh();
    };
    ws.onmessage = (e) => this.dispatch(e.data);
    ws.onclose = (e) => this.onClose(e);
    ws.onerror = () => {}; // onclose follows with the details
  }

  onClose(e) {
    this.stopHeartbeat();
    clearTimeout(this.refreshTimer);
    this.refreshing = null;
    this.failPending("emit", "disconnected");
    this.ws = null;
    // 4004: the project is gone; 4001: the key was revoked, and a handshake
    // with it can only fail (a browser cannot see that 401); 4012: the
    // backend revoked this user's tokens (the page decides what comes next).
    if (this.closedByUser || !this.options.reconnect || e.code === 4004 || e.code === 4001 || e.code === 4012) {
      this.setState("closed");
      return;
    }
    if (this.openedAt && Date.now() - this.openedAt > HEALTHY_MS) this.attempt = 0;
    this.openedAt = 0;
    // 4011: the connection token expired (or a refresh was refused): a
    // fresh token, at once.
    if (e.code === CLOSE_TOKEN_EXPIRED) {
      this.setState("reconnecting");
      this.reconnectTimer = setTimeout(() => this.connect(), 0);
      return;
    }
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

  // scheduleRefresh plans the connection token's refresh REFRESH_LEAD_MS
  // before its exp (the server's token_expiring may come first). A short
  // token (under twice that when got) is refreshed halfway to its exp, at
  // least a second later, and token_expiring about it is left to this
  // timer: a backend minting short tokens is not asked in a loop.
  scheduleRefresh() {
    clearTimeout(this.refreshTimer);
    if (!this.options.token || this.tokenExp === undefined) return;
    const left = this.tokenExp - Date.now();
    this.tokenShort = left < 2 * REFRESH_LEAD_MS;
    const delay = Math.max(left - REFRESH_LEAD_MS, left / 2, 1000);
    this.refreshTimer = setTimeout(() => this.refresh(), Math.min(delay, 0x7fffffff));
  }

  // refresh sends a fresh connection token on the open socket, one at a time.
  refresh() {
    const ws = this.ws;
    if (!this.options.token || !ws || this.refreshing) return;
    this.refreshing = { ws };
    const refreshing = this.refreshing;
    callToken(this.options.token).then(
      (token) => {
        if (this.refreshing !== refreshing || this.ws !== ws) return;
        refreshing.exp = tokenExp(token);
        if (!this.send({ action: "refresh", token })) this.refreshing = null;
      },
      (err) => {
        if (this.refreshing !== refreshing) return;
        this.refreshing = null;
        this.emitEvent("error", err); // the socket lives until 4011, which reconnects with a fresh one
      },
    );
  }

  // restart drops the socket and reconnects at once (a refused refresh).
  restart() {
    const ws = this.ws;
    if (!ws) return;
    ws.onclose = ws.onmessage = ws.onopen = null;
    try {
      ws.close(1000);
    } catch {}
    this.onClose({ code: CLOSE_TOKEN_EXPIRED });
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
    const frame = (token) => {
      const msg = { action: "subscribe", channel: sub.channel };
      if (sub.presence) Object.assign(msg, { presence: true, clientId: sub.clientId });
      if (sub.lastSeq !== undefined) msg.since = sub.lastSeq;
      if (token !== undefined) msg.token = token;
      return msg;
    };
    if (!sub.handlers.token) {
      this.send(frame());
      return;
    }
    // A subscribe token for this (re)subscribe: sent if the subscription is
    // still the channel's and the socket the same when it comes.
    const ws = this.ws;
    if (!ws || ws.readyState !== WebSocket.OPEN) return; // onopen subscribes it
    callToken(sub.handlers.token, sub.channel).then(
      (token) => {
        if (this.subs.get(sub.channel) === sub && this.ws === ws) this.send(frame(token));
      },
      (err) => {
        if (this.subs.get(sub.channel) === sub && this.ws === ws) this.refuse(sub, err);
      },
    );
  }

  // refuse ends a subscription refused before its ack: the server keeps an
  // earlier subscription as it was, else there is none (nor is it resent on
  // reconnect).
  refuse(sub, err) {
    if (!sub.acked) {
      if (sub.prev) {
        if (sub.lastSeq !== undefined && (sub.prev.lastSeq === undefined || sub.lastSeq > sub.prev.lastSeq)) sub.prev.lastSeq = sub.lastSeq;
        this.subs.set(sub.channel, sub.prev);
      } else this.subs.delete(sub.channel);
    }
    sub.rejectReady(err);
    sub.handlers.onError?.(err);
  }

  // subscribe(channel, { presence, clientId, since, token, onMessage, onPresence, onGap, onError })
  // returns { channel, members, ready (a promise of the first ack), unsubscribe() }.
  subscribe(channel, opts = {}) {
    const sub = {
      channel,
      presence: !!opts.presence,
      clientId: opts.clientId,
      members: [],
      // where it starts: given; else where the subscription it replaces
      // is (no replay of what that one delivered); else the stored seq.
      lastSeq: opts.since ?? this.subs.get(channel)?.lastSeq ?? this.resume?.load(channel),
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
      if (this.refreshing && m.channel === undefined && (m.error === "invalid_token" || m.error === "unknown_action")) {
        this.refreshing = null;
        // unknown_action: the project has no channel authorization (the token
        // is ignored there), nothing to refresh. invalid_token: reconnect
        // with a fresh token.
        if (m.error === "invalid_token") {
          this.emitEvent("error", err);
          this.restart();
        }
      } else if (sub && answersSubscribe) {
        this.refuse(sub, err);
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
    if (m.action === "refresh") {
      if (m.ok && this.refreshing) {
        this.tokenExp = this.refreshing.exp;
        this.refreshing = null;
        this.scheduleRefresh();
      }
      return;
    }
    if (m.type === "token_expiring") {
      // Stale when about a token already replaced (sent before the refresh
      // was taken); about a short token, scheduleRefresh has planned the
      // next refresh.
      const exp = typeof m.exp === "number" ? m.exp * 1000 : undefined;
      const known = this.tokenExp !== undefined && exp !== undefined;
      if (!(known && (exp < this.tokenExp || (exp === this.tokenExp && this.tokenShort)))) this.refresh();
      return;
    }
    if (m.action === "emit") {
      if (sub && (sub.lastSeq === undefined || m.seq > sub.lastSeq)) this.seen(sub, m.seq);
      this.takePending("emit", m.channel)?.resolve(m.seq);
      return;
    }
    if (!sub) return;
    // A message has a seq; its type is the sender's, which may be "presence".
    if (typeof m.seq === "number") {
      if (sub.lastSeq !== undefined && m.seq <= sub.lastSeq) return; // seen before a reconnect
      this.seen(sub, m.seq);
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
    this.resume?.close();
    clearTimeout(this.reconnectTimer);
    clearTimeout(this.refreshTimer);
    this.stopHeartbeat();
    if (this.ws) this.ws.close(1000);
    else this.setState("closed");
  }
}
