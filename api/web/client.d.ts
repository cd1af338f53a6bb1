// Types of Relay's browser client, /client.js (served beside it as
// /client.d.ts; api/web/README.md, the protocol in proto/PROTOCOL.md).
//
//   import { Relay, type Message } from "./client.js";
//
// They describe the client's public surface: the Relay class (constructor,
// on, subscribe, unsubscribe, emit, close, state, url), the subscription it
// returns, and backoffDelay. The rest of what client.js keeps on a Relay or a
// subscription (options, subs, pending, listeners, ws, timers, send,
// dispatch, handlers, …) is internal and not declared.
// api/web/typecheck/example.ts uses every declaration here under
// `tsc --strict` in make test.

/** Connection state, reported by the "state" event. */
export type State = "connecting" | "open" | "reconnecting" | "closed";

/**
 * Options of `new Relay(…)`. Leave an option out for its default: the client
 * spreads these over its defaults, so an explicit `undefined` (allowed unless
 * exactOptionalPropertyTypes is on) replaces the default (url excepted).
 */
export interface RelayOptions {
  /**
   * The relay's address, `http(s)://host[:port]` (or `ws(s)://…`); the client
   * connects to `/ws` there, whatever path this has. Default
   * `location.origin`.
   */
  url?: string | undefined;
  /** The project's public key (`pk_live_…`); the constructor throws without one. */
  publicKey: string;
  /**
   * Reconnect after an unexpected close (default `true`); never after 4004
   * (project deleted), 4001 (key revoked: connect again with the new key) or
   * 4012 (the backend revoked this user's tokens).
   */
  reconnect?: boolean;
  /** Cap of the reconnect backoff, in ms (default 30000). */
  maxReconnectDelayMs?: number;
  /** Ping every this many ms (default 240000); 0 disables the heartbeat. */
  heartbeatIntervalMs?: number;
  /** Wait this long for a pong before abandoning the socket, in ms (default 15000). */
  heartbeatAckTimeoutMs?: number;
  /**
   * Channel authorization (proto/PROTOCOL.md): gives a connection token
   * (a JWT from your backend). Called on every connect and reconnect (sent
   * as `&token=`), and to refresh the token on the socket 30 s before its
   * `exp` or when the server says `token_expiring`; after a close 4011 or a
   * refused refresh the client reconnects at once with a fresh one. A
   * callback that throws, rejects or gives no string is reported to the
   * "error" event as `token_unavailable`. Without it no token is sent.
   */
  token?: (() => Promise<string> | string) | undefined;
  /**
   * Resume across page loads (default off): keep each channel's last seq in
   * `localStorage` (`true`), or in `storage`, under
   * `relay:<publicKey>:<channel>`, and start a later subscribe to the channel
   * with `since` = that seq, so that what came while the page was away is
   * replayed (or a `replay_gap` says what cannot be). Written within 250 ms,
   * and when the page is hidden or left, and at `close()`.
   */
  resume?: boolean | { storage: Pick<Storage, "getItem" | "setItem"> } | undefined;
}

/** The error codes of the socket (proto/PROTOCOL.md › Errors on the socket). */
export type ErrorCode =
  | "invalid_json"
  | "unknown_action"
  | "invalid_channel"
  | "client_id_required"
  | "invalid_since"
  | "client_id_too_long"
  | "too_many_subscriptions"
  | "too_many_presence_members"
  | "too_many_channels"
  | "client_emit_not_configured"
  | "token_and_type_required"
  | "invalid_emit_token"
  | "emit_identity_mismatch"
  | "emit_token_revoked"
  | "client_emit_rate_limited"
  | "payload_too_large"
  | "project_rate_limited"
  | "channel_rate_limited"
  | "service_unavailable"
  // Channel authorization (proto/PROTOCOL.md): a refused subscribe, a refused refresh.
  | "token_required"
  | "client_id_mismatch"
  | "channel_forbidden"
  | "invalid_subscribe_token"
  | "invalid_token"
  // The client's own: a token callback threw, rejected or gave no string.
  | "token_unavailable";

/**
 * An error frame of the server, as an Error whose message is its code. It
 * rejects the emit or the subscription it answers (and goes to that
 * subscription's onError), or else goes to the "error" event.
 */
export interface RelayError extends Error {
  /** The code; a code this version does not list is still passed on. */
  code: ErrorCode | (string & {});
  /** The channel the frame named, if any. */
  channel?: string | undefined;
}

/**
 * A message on a channel. From `POST /emit` it has channel, payload and seq;
 * a client-emitted one also has the sender's type and clientId; one sent
 * again after a reconnect (or asked for with since) has `replay: true`.
 */
export interface Message<P = unknown> {
  channel: string;
  payload: P;
  /** Per channel, rising, below 2^53 (exact in a number). */
  seq: number;
  /** The message type, client-emitted messages only. */
  type?: string;
  /** The sender's clientId, client-emitted messages only. */
  clientId?: string;
  /** Present (true) on a replayed message. */
  replay?: boolean;
}

/**
 * A presence frame with the subscription's member list after it: `sync`
 * lists the other members, `join` and `leave` name one clientId.
 */
export type PresenceEvent =
  | { type: "presence"; channel: string; event: "sync"; members: string[] }
  | { type: "presence"; channel: string; event: "join" | "leave"; clientId: string; members: string[] };

/** Messages after `since` may be missing: the application should resynchronise. */
export interface Gap {
  type: "replay_gap";
  channel: string;
  /** The since the client resubscribed with: the last seq it had. */
  since: number;
}

/** Options and handlers of `relay.subscribe(…)`. */
export interface SubscribeOptions<P = unknown> {
  /** Join the channel's presence; needs clientId (else onError gets client_id_required). */
  presence?: boolean | undefined;
  clientId?: string | undefined;
  /**
   * Start from this seq (as after a reconnect): what the channel sent after
   * it is replayed first. Overrides what `resume` stored.
   */
  since?: number | undefined;
  /**
   * Gives a subscribe token for this channel (channel authorization), called
   * on every subscribe and resubscribe of it and sent with the subscribe. A
   * callback that fails refuses the subscription with `token_unavailable`.
   */
  token?: (() => Promise<string> | string) | undefined;
  /** Each message once, in seq order; duplicates after a reconnect are dropped. */
  onMessage?: ((message: Message<P>) => void) | undefined;
  onPresence?: ((event: PresenceEvent) => void) | undefined;
  onGap?: ((gap: Gap) => void) | undefined;
  /** An error frame refusing this subscription (it also rejects `ready`). */
  onError?: ((error: RelayError) => void) | undefined;
}

/**
 * One channel's subscription, kept across reconnects (resubscribed with
 * since = lastSeq) until unsubscribe. Subscribing to the channel again
 * replaces it with a new one.
 */
export interface Subscription<P = unknown> {
  readonly channel: string;
  readonly presence: boolean;
  readonly clientId: string | undefined;
  /** The presence members, kept up to date from sync, join and leave. */
  readonly members: readonly string[];
  /** The last seq delivered (or acked to an own emit); undefined before any. */
  readonly lastSeq: number | undefined;
  /** Resolves with this subscription at the server's first ack, rejects with the RelayError refusing it. */
  readonly ready: Promise<Subscription<P>>;
  /** The same as `relay.unsubscribe(channel)`. */
  unsubscribe(): void;
}

export class Relay {
  /** Connects at once (throws when publicKey is empty). */
  constructor(options: RelayOptions);
  /** The WebSocket address, `ws(s)://host/ws?publicKey=…`. */
  readonly url: string;
  readonly state: State;
  /** Listens to state changes; returns a function that removes the listener (true if it was still there). */
  on(event: "state", listener: (state: State) => void): () => boolean;
  /** Error frames that answer no pending emit or subscription. */
  on(event: "error", listener: (error: RelayError) => void): () => boolean;
  /** Subscribes now (and again after each reconnect, with since). */
  subscribe<P = unknown>(channel: string, options?: SubscribeOptions<P>): Subscription<P>;
  /** Ends the channel's subscription; nothing happens if there is none. */
  unsubscribe(channel: string): void;
  /**
   * Client-emits payload (any JSON value) with a client-emit token minted by
   * the backend; the connection must be subscribed there with presence under
   * the token's clientId. Resolves with the message's seq; rejects with a
   * RelayError when refused, with Error("not connected") when the socket is
   * not open, with Error("disconnected") when it closes before the answer.
   */
  emit(channel: string, type: string, payload: unknown, token: string): Promise<number>;
  /** Closes with 1000 and stops reconnecting; the state ends "closed". */
  close(): void;
}

/**
 * The delay before reconnect attempt `attempt` (0-based), in ms:
 * 500 × 2^attempt capped at maxMs, times 0.5 + random() (±50 % jitter).
 */
export function backoffDelay(attempt: number, maxMs: number, random?: () => number): number;
