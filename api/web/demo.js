import { Relay } from "/client.js";

const $ = (id) => document.getElementById(id);
$("curl").textContent = $("curl").textContent.replace("http://HOST", location.origin);
let relay;

$("join").addEventListener("submit", (e) => {
  e.preventDefault();
  relay?.close();
  $("messages").replaceChildren();
  relay = new Relay({ url: location.origin, publicKey: $("key").value.trim() });
  relay.on("state", (s) => ($("state").textContent = s));
  relay.on("error", (err) => add(`error: ${err.code}`));
  relay.subscribe($("channel").value.trim(), {
    presence: true,
    clientId: $("name").value.trim(),
    onMessage: (m) =>
      add(`#${m.seq}${m.replay ? " (replay)" : ""} ${m.clientId ? `${m.clientId} (${m.type}): ` : ""}${JSON.stringify(m.payload)}`),
    onPresence: (p) => {
      $("members").replaceChildren(...p.members.map((id) => Object.assign(document.createElement("li"), { textContent: id })));
    },
    onGap: (g) => add(`some messages after #${g.since} were missed`, "gap"),
    onError: (err) => add(`error: ${err.code}`),
  });
});

function add(text, cls) {
  const li = Object.assign(document.createElement("li"), { textContent: text });
  if (cls) li.className = cls;
  $("messages").append(li);
}

// Client emit. The token is a JWT: its claims (read here, not verified: the
// server does that) name the channel, the clientId and the allowed types.
function claimsOf(token) {
  const part = token.split(".")[1];
  if (!part) return null;
  try {
    const b64 = part.replace(/-/g, "+").replace(/_/g, "/") + "=".repeat((4 - (part.length % 4)) % 4);
    const claims = JSON.parse(atob(b64));
    return claims && typeof claims === "object" ? claims : null;
  } catch {
    return null;
  }
}

$("emit-token").addEventListener("input", () => {
  const claims = claimsOf($("emit-token").value.trim());
  if (!claims) return;
  if (typeof claims.ch === "string") $("emit-channel").value = claims.ch;
  if (Array.isArray(claims.types) && typeof claims.types[0] === "string") $("emit-type").value = claims.types[0];
});

// The emitting connection: subscribed with presence under the token's
// clientId, as the server requires (api/web/README.md), and kept while the
// key, channel and clientId stay the same.
let emitter = null;

function emitterFor(key, channel, clientId) {
  if (emitter && emitter.key === key && emitter.channel === channel && emitter.clientId === clientId && emitter.relay.state !== "closed") {
    return emitter;
  }
  emitter?.relay.close();
  const r = new Relay({ url: location.origin, publicKey: key });
  const sub = r.subscribe(channel, { presence: true, clientId });
  emitter = { relay: r, key, channel, clientId, ready: sub.ready };
  return emitter;
}

function within(promise, ms, message) {
  let timer;
  const timeout = new Promise((_, reject) => (timer = setTimeout(() => reject(new Error(message)), ms)));
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

function result(text, failed) {
  const p = $("emit-result");
  p.textContent = text;
  p.className = failed ? "flash error" : "flash notice";
  p.hidden = false;
}

$("emit").addEventListener("submit", async (e) => {
  e.preventDefault();
  const key = $("key").value.trim();
  const token = $("emit-token").value.trim();
  const channel = $("emit-channel").value.trim();
  const type = $("emit-type").value.trim();
  const text = $("emit-message").value;
  if (!key) return result("Paste the project's public key above first: the emit goes over a connection of its own.", true);
  const claims = claimsOf(token);
  if (!claims || typeof claims.clientId !== "string" || !claims.clientId) {
    return result("This is not a client-emit token: a JWT whose claims name a clientId.", true);
  }
  let payload;
  try {
    payload = JSON.parse(text);
  } catch {
    payload = { text };
  }
  result("Emitting…");
  const em = emitterFor(key, channel, claims.clientId);
  try {
    await within(em.ready, 10000, "no connection within 10 s: check the public key");
    const seq = await em.relay.emit(channel, type, payload, token);
    result(`Emitted as ${claims.clientId} on ${channel}: seq ${seq}.`);
  } catch (err) {
    if (!err.code) {
      em.relay.close(); // start afresh next time
      if (emitter === em) emitter = null;
    }
    result(`Refused: ${err.code || err.message}`, true);
  }
});
