// Type-checked (not run) by check.sh in make test, under tsc --strict, against
// the client as a vendored package (package.json, client.js, client.d.ts in
// node_modules/@relayhq/client): it uses every declaration of client.d.ts, and
// the @ts-expect-error lines check that the types refuse what client.js
// cannot do.
import {
  Relay,
  backoffDelay,
  type ErrorCode,
  type Gap,
  type Message,
  type PresenceEvent,
  type RelayError,
  type RelayOptions,
  type State,
  type Subscription,
  type SubscribeOptions,
} from "@relayhq/client";

interface Chat {
  text: string;
}

const options: RelayOptions = {
  url: "http://localhost:8080",
  publicKey: "pk_live_example",
  reconnect: true,
  maxReconnectDelayMs: 30000,
  heartbeatIntervalMs: 240000,
  heartbeatAckTimeoutMs: 15000,
};
const relay = new Relay(options);
new Relay({ publicKey: "pk_live_example" }); // url defaults to location.origin
// Channel authorization: a connection token from the page's backend, sync or async.
new Relay({
  publicKey: "pk_live_example",
  token: () => fetch("/relay-token").then((r) => r.text()),
});
new Relay({ publicKey: "pk_live_example", token: () => "eyJ.a.b" });
// Resume across page loads: localStorage, or any Storage.
new Relay({ publicKey: "pk_live_example", resume: true });
new Relay({ publicKey: "pk_live_example", resume: { storage: sessionStorage } });
const address: string = relay.url;
let state: State = relay.state;

const offState: () => boolean = relay.on("state", (s: State) => {
  state = s;
  if (s === "closed") console.log("closed");
});
const offError = relay.on("error", (err: RelayError) => {
  const code: string = err.code;
  const channel: string | undefined = err.channel;
  console.log(err.message, code, channel);
});
offState();
offError();

function describe(code: ErrorCode): string {
  switch (code) {
    case "channel_rate_limited":
    case "project_rate_limited":
    case "client_emit_rate_limited":
      return "slow down";
    case "channel_forbidden":
    case "token_required":
    case "client_id_mismatch":
    case "invalid_subscribe_token":
    case "invalid_token":
    case "token_unavailable":
      return "not allowed";
    default:
      return code;
  }
}

const handlers: SubscribeOptions<Chat> = {
  presence: true,
  clientId: "ann",
  onMessage: (m: Message<Chat>) => {
    const seq: number = m.seq;
    const text: string = m.payload.text;
    const replayed: boolean = m.replay === true;
    const from: string | undefined = m.clientId;
    const type: string | undefined = m.type;
    console.log(m.channel, seq, text, replayed, from, type);
  },
  onPresence: (e: PresenceEvent) => {
    const members: string[] = e.members;
    if (e.event === "sync") console.log("members", members);
    else console.log(e.event, e.clientId); // join and leave name one clientId
  },
  onGap: (g: Gap) => {
    const since: number = g.since;
    console.log("missed after", since, g.channel, g.type);
  },
  onError: (err: RelayError) => console.log(describe(err.code as ErrorCode), err.channel),
};
const room: Subscription<Chat> = relay.subscribe<Chat>("room:1", handlers);
const plain: Subscription = relay.subscribe("feed"); // payload unknown, no handlers
const doc: Subscription = relay.subscribe("private-doc-9", {
  token: async () => (await fetch("/relay-subscribe-token?channel=private-doc-9")).text(),
  onError: (err: RelayError) => console.log(err.code === "invalid_subscribe_token"),
});
console.log(doc.channel);
const resumed: Subscription = relay.subscribe("feed:2", { since: 1763921800123456 }); // replays what came after
console.log(resumed.lastSeq);
const members: readonly string[] = room.members;
const last: number | undefined = room.lastSeq;
console.log(room.channel, room.presence, room.clientId, members, last, plain.channel, address, state);

async function main(token: string): Promise<void> {
  const ready: Subscription<Chat> = await room.ready;
  console.log(ready === room);
  try {
    const seq: number = await relay.emit("room:1", "chat", { text: "hi" } satisfies Chat, token);
    console.log("emitted", seq);
  } catch (e) {
    const err = e as RelayError;
    console.log(err.code ?? err.message);
  }
  room.unsubscribe();
  relay.unsubscribe("feed");
  relay.close();
}
void main("token-from-your-backend");

const delay: number = backoffDelay(3, 30000) + backoffDelay(0, 30000, Math.random) + backoffDelay(1, 500, () => 0.5);
console.log(delay);

// What client.js cannot do, refused by the types:
// @ts-expect-error publicKey is required
new Relay({ url: "http://localhost:8080" });
// @ts-expect-error there is no "message" event on a Relay (messages go to onMessage)
relay.on("message", () => {});
// @ts-expect-error a state listener gets a State, not a number
relay.on("state", (s: number) => s);
// @ts-expect-error emit needs a token
void relay.emit("room:1", "chat", {});
// @ts-expect-error members is read-only: the client replaces it on each presence frame
room.members.push("eve");
// @ts-expect-error a payload is unknown unless typed through subscribe<P>
relay.subscribe("feed", { onMessage: (m) => m.payload.text });
// @ts-expect-error backoffDelay's random is a function
backoffDelay(0, 1000, 0.5);
// @ts-expect-error an explicit undefined would replace the default (under exactOptionalPropertyTypes)
new Relay({ publicKey: "pk_live_example", reconnect: undefined });
// @ts-expect-error a token option is a callback, not the token itself
new Relay({ publicKey: "pk_live_example", token: "eyJ.a.b" });
// @ts-expect-error a subscribe token callback gives a string
relay.subscribe("private-doc-9", { token: () => 42 });
// @ts-expect-error internals are not declared
relay.dispatch("{}");
// @ts-expect-error resume takes a Storage-like object, not a key name
new Relay({ publicKey: "pk_live_example", resume: "relay" });
// @ts-expect-error since is a seq (a number)
relay.subscribe("feed", { since: "1763921800123456" });
