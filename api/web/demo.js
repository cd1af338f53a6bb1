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
    onMessage: (m) => add(`#${m.seq}${m.replay ? " (replay)" : ""} ${JSON.stringify(m.payload)}`),
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
