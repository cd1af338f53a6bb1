package main

// Channel authorization (proto/PROTOCOL.md) with the browser client in real
// headless Chromium: a project with authorization on, pages whose token
// callback fetches a connection token from "the page's backend" (a test
// server in front of the relay, same origin, minting with
// api/backend.MintConnectionToken), a private channel granted by the token,
// one refused without a grant, one granted by a subscribe token; a reconnect
// asks the callbacks again; the client refreshes before exp on its own and on
// the server's token_expiring; a close 4011 reconnects at once with a fresh
// token and resumes with since; a refused refresh reconnects.

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/relayhq/relay/api/backend"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// tokenBackend is the page's backend: /token and /subtoken mint tokens with
// the project's authorization secret on the server's clock; every other
// path goes to the relay (through target, the test proxy).
func tokenBackend(t *testing.T, target, secret string, now func() time.Time) string {
	t.Helper()
	to, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/token", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		ttl, _ := strconv.Atoi(q.Get("ttl"))
		rights := []string{backend.RightSubscribe}
		if q.Get("presence") == "1" {
			rights = append(rights, backend.RightPresence)
		}
		grants := map[string][]string{}
		for _, ch := range strings.Split(q.Get("grant"), ",") {
			if ch != "" {
				grants[ch] = rights
			}
		}
		tok, err := backend.MintConnectionToken(backend.ConnectionTokenOptions{
			Secret: secret, UserID: q.Get("user"), TTL: time.Duration(ttl) * time.Second, Channels: grants, Now: now(),
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Write([]byte(tok))
	})
	mux.HandleFunc("/subtoken", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		tok, err := backend.MintSubscribeToken(backend.SubscribeTokenOptions{
			Secret: secret, Channel: q.Get("channel"), UserID: q.Get("user"), TTL: time.Minute, Now: now(),
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Write([]byte(tok))
	})
	mux.Handle("/", httputil.NewSingleHostReverseProxy(to)) // WebSocket upgrades included
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

// startAuthz loads base/demo and starts a client whose token callback
// (tokenQuery "" for none) fetches /token?…; window.hang(n) and
// window.garble(n) make the callback's n-th call hang, or give a token that
// is not one. window.sub(channel, options) subscribes, logging what comes.
// The log has token:N per callback call, close:CODE per socket closed,
// sent:refresh and got:… for the refresh frames, subtoken:CHANNEL per
// subscribe-token callback call.
func startAuthz(p *relaytest.Tab, base, publicKey, tokenQuery string) {
	p.B.T.Helper()
	p.Run(chromedp.Navigate(base + "/demo"))
	tokenOpt := "undefined"
	if tokenQuery != "" {
		tokenOpt = fmt.Sprintf(`() => {
			const n = ++window.calls;
			log.push("token:" + n);
			if (window.hang(n)) return new Promise(() => {});
			if (window.garble(n)) return "not-a-jwt";
			return fetch("/token?" + window.tokenQuery).then((r) => r.ok ? r.text() : Promise.reject(new Error("token " + r.status)));
		}`)
	}
	p.Eval(fmt.Sprintf(`
		window.log = []; window.calls = 0; window.tokenQuery = %q;
		window.hang = () => false; window.garble = () => false;
		import("/client.js").then(({ Relay }) => {
			window.relay = new Relay({ url: location.origin, publicKey: %q, token: %s });
			const send = relay.send.bind(relay), dispatch = relay.dispatch.bind(relay);
			relay.send = (m) => {
				if (m.action === "refresh") log.push("sent:refresh");
				if (m.action === "subscribe") log.push("sent:subscribe:" + m.channel + (m.token ? ":token" : "") + (m.since !== undefined ? ":since" : ""));
				return send(m);
			};
			relay.dispatch = (data) => {
				const m = JSON.parse(data);
				if (m.type === "token_expiring") log.push("got:token_expiring");
				if (m.action === "refresh") log.push("got:refresh:" + m.ok);
				if (m.action === "subscribe" && m.ok) log.push("got:subscribe:" + m.channel);
				if (m.error === "invalid_token") log.push("got:invalid_token");
				dispatch(data);
			};
			relay.on("state", (s) => {
				log.push("state:" + s);
				if (s === "open") relay.ws.addEventListener("close", (e) => log.push("close:" + e.code));
			});
			relay.on("error", (e) => log.push("error:" + e.code));
			window.sub = (channel, options) => {
				const s = relay.subscribe(channel, { ...options,
					onMessage: (m) => log.push("msg:" + channel + ":" + m.seq + ":" + JSON.stringify(m.payload) + (m.replay ? ":replay" : "")),
					onPresence: (e) => log.push("presence:" + channel + ":" + e.event + ":" + e.members.join(",")),
					onError: (e) => log.push("suberror:" + channel + ":" + e.code),
				});
				s.ready.then(() => log.push("ready:" + channel), (e) => log.push("rejected:" + channel + ":" + e.code));
			};
			window.subWithToken = (channel, query, options) => sub(channel, { ...options, token: () => {
				log.push("subtoken:" + channel);
				return fetch("/subtoken?" + query).then((r) => r.text());
			} });
			log.push("loaded");
		});`, tokenQuery, publicKey, tokenOpt))
	p.WaitFor(0, "loaded")
}

func TestBrowserAuthorization(t *testing.T) {
	// Not parallel: a token with 1 to 2 s left when Chromium starts the client.
	start := time.Now()
	clock := relaytest.NewClock(start) // stands still until the test sets it
	ts := startServerAt(t, storetest.SQLiteURL(t), nil, clock.Now)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("private")
	r := owner.Do("PATCH", "/api/projects/"+p.ID+"/authorization", `{"authorization":true}`)
	secret, _ := r.JSON["secret"].(string)
	if r.Status != http.StatusOK || r.JSON["authorization"] != true || secret == "" {
		t.Fatalf("turn authorization on: %d %s", r.Status, r.Raw)
	}
	px := relaytest.NewProxy(t, ts.Addr())
	front := tokenBackend(t, px.Base(), secret, clock.Now)
	b := relaytest.NewBrowser(t, front)
	emit := func(channel string, payload int) uint64 {
		t.Helper()
		res, err := backend.Emit(context.Background(), nil, ts.Base+"/emit", p.SecretKey, channel, map[string]int{"n": payload})
		if err != nil || !res.OK {
			t.Fatalf("emit on %s: %+v %v", channel, res, err)
		}
		return res.Seq
	}
	msg := func(channel string, seq uint64, n int, replay bool) string {
		s := fmt.Sprintf(`msg:%s:%d:{"n":%d}`, channel, seq, n)
		if replay {
			s += ":replay"
		}
		return s
	}

	// A token granting private-user-42 (with presence) to user-42: the
	// subscribe is acked, presence as user-42 too, a backend emit arrives.
	ann := b.NewTab(t)
	startAuthz(ann, front, p.PublicKey, "user=user-42&grant=private-user-42&presence=1&ttl=600")
	ann.Eval(`sub("private-user-42", { presence: true, clientId: "user-42" })`)
	annAt := ann.WaitFor(0, "token:1", "state:open", "sent:subscribe:private-user-42", "ready:private-user-42", "presence:private-user-42:sync:")
	if !ann.Check(`relay.url.endsWith("/ws?publicKey=` + p.PublicKey + `") && relay.ws.url.includes("&token=ey")`) {
		t.Fatalf("ann's addresses: %q", ann.Log())
	}
	s1 := emit("private-user-42", 1)
	annAt = ann.WaitFor(annAt, msg("private-user-42", s1, 1, false))

	// No grant (user-7's token grants nothing): channel_forbidden refuses
	// the subscription (onError and ready), and the client forgets it;
	// presence under another clientId than the token's sub is refused.
	bob := b.NewTab(t)
	startAuthz(bob, front, p.PublicKey, "user=user-7&ttl=600")
	bob.Eval(`sub("private-user-42")`)
	bobAt := bob.WaitFor(0, "token:1", "state:open", "suberror:private-user-42:channel_forbidden", "rejected:private-user-42:channel_forbidden")
	bob.Eval(`sub("lobby", { presence: true, clientId: "user-42" })`)
	bobAt = bob.WaitFor(bobAt, "suberror:lobby:client_id_mismatch", "rejected:lobby:client_id_mismatch")
	if !bob.Check(`!relay.subs.has("private-user-42") && !relay.subs.has("lobby")`) {
		t.Fatal("bob's refused subscriptions are still held")
	}

	// A subscribe token from the subscribe's own callback grants
	// private-doc-9; one for another channel is invalid_subscribe_token.
	bob.Eval(`subWithToken("private-doc-9", "channel=private-doc-9&user=user-7")`)
	bobAt = bob.WaitFor(bobAt, "subtoken:private-doc-9", "sent:subscribe:private-doc-9:token", "ready:private-doc-9")
	bob.Eval(`subWithToken("private-doc-10", "channel=private-doc-9")`)
	bob.WaitFor(bobAt, "subtoken:private-doc-10", "suberror:private-doc-10:invalid_subscribe_token", "rejected:private-doc-10:invalid_subscribe_token")
	s2 := emit("private-doc-9", 2)
	bobAt = bob.WaitFor(bobAt, msg("private-doc-9", s2, 2, false))

	// Without the token option: no token sent, public channels as before,
	// presence refused with token_required.
	cat := b.NewTab(t)
	startAuthz(cat, front, p.PublicKey, "")
	cat.Eval(`sub("lobby"); sub("room", { presence: true, clientId: "cat" })`)
	catAt := cat.WaitFor(0, "state:open")
	cat.WaitFor(catAt, "ready:lobby")
	cat.WaitFor(catAt, "suberror:room:token_required", "rejected:room:token_required")
	if !cat.Check(`!relay.ws.url.includes("token") && window.calls === 0`) {
		t.Fatalf("cat sent a token: %q", cat.Log())
	}
	if n := cat.Count(0, "error:"); n != 0 {
		t.Fatalf("cat: %q", cat.Log())
	}

	// A cut connection: each page asks its callbacks again (a fresh
	// connection token, a fresh subscribe token) and resubscribes with
	// since; what was emitted meanwhile comes back replayed.
	px.HoldNew()
	px.Cut()
	annAt = ann.WaitFor(annAt, "state:reconnecting")
	bobAt = bob.WaitFor(bobAt, "state:reconnecting")
	s3, s4 := emit("private-user-42", 3), emit("private-doc-9", 4)
	px.Release()
	annAt = ann.WaitFor(annAt, "token:2", "state:open", "sent:subscribe:private-user-42:since", msg("private-user-42", s3, 3, true))
	bobAt = bob.WaitFor(bobAt, "token:2", "state:open", "subtoken:private-doc-9", "sent:subscribe:private-doc-9:token:since", msg("private-doc-9", s4, 4, true))
	if n := bob.Count(0, "subtoken:private-doc-9"); n != 2 {
		t.Fatalf("bob's subscribe-token callback called %d times, want 2: %q", n, bob.Log())
	}

	// A short token (2 s left on the page's clock; the tokens are minted on
	// the server's clock, start, which stands still): the server tells
	// token_expiring at once, and the client refreshes on its own timer,
	// halfway to the exp, a second later (not on the notice, which would
	// loop with a backend minting short tokens).
	dan := b.NewTab(t)
	ttl := 2 + int(time.Since(start).Seconds())
	startAuthz(dan, front, p.PublicKey, fmt.Sprintf("user=user-42&grant=private-user-42&ttl=%d", ttl))
	dan.WaitFor(0, "token:1", "state:open", "got:token_expiring", "token:2", "sent:refresh", "got:refresh:true")
	if !dan.Check(`relay.tokenShort === true`) || dan.Count(0, "state:reconnecting") != 0 {
		t.Fatalf("dan: %q", dan.Log())
	}
	dan.Eval(`relay.close()`)

	// The server's token_expiring (its clock 20 s before the 600 s tokens'
	// exp): ann and bob refresh. Erin's refresh hangs
	// in her callback; at exp + 5 s the server closes her socket 4011 and
	// she reconnects at once (no backoff) with a fresh token, resuming
	// with since. Her reconnect is held at the proxy while a message goes.
	erin := b.NewTab(t)
	startAuthz(erin, front, p.PublicKey, "user=user-42&grant=private-user-42&ttl=600")
	erin.Eval(`window.hang = (n) => n === 2; sub("private-user-42")`)
	erinAt := erin.WaitFor(0, "token:1", "state:open", "ready:private-user-42")
	s5 := emit("private-user-42", 5)
	erinAt = erin.WaitFor(erinAt, msg("private-user-42", s5, 5, false))
	annAt = ann.WaitFor(annAt, msg("private-user-42", s5, 5, false))
	clock.Set(start.Add(580 * time.Second))
	annAt = ann.WaitFor(annAt, "got:token_expiring", "token:3", "sent:refresh", "got:refresh:true")
	bobAt = bob.WaitFor(bobAt, "got:token_expiring", "token:3", "sent:refresh", "got:refresh:true")
	erinAt = erin.WaitFor(erinAt, "got:token_expiring", "token:2")
	px.HoldNew()
	clock.Set(start.Add(606 * time.Second))
	erinAt = erin.WaitFor(erinAt, "state:reconnecting", "close:4011", "token:3")
	s6 := emit("private-user-42", 6)
	annAt = ann.WaitFor(annAt, msg("private-user-42", s6, 6, false))
	px.Release()
	erinAt = erin.WaitFor(erinAt, "state:open", "sent:subscribe:private-user-42:since", msg("private-user-42", s6, 6, true))
	if !erin.Check(`relay.attempt === 0`) || erin.Count(0, "sent:refresh") != 0 || erin.Count(0, "state:connecting") != 0 {
		t.Fatalf("erin's reconnect after 4011: %q", erin.Log())
	}
	if ann.Count(0, "close:") != 1 || bob.Count(0, "close:") != 1 { // the cut only
		t.Fatalf("ann or bob closed after refreshing: %q %q", ann.Log(), bob.Log())
	}

	// A refresh the server refuses (invalid_token): the error event, then
	// a reconnect at once with a fresh token.
	erin.Eval(`window.garble = (n) => n === 4; relay.refresh()`)
	erinAt = erin.WaitFor(erinAt, "token:4", "sent:refresh", "got:invalid_token", "error:invalid_token", "state:reconnecting", "token:5", "state:open",
		"sent:subscribe:private-user-42:since", "got:subscribe:private-user-42")
	s7 := emit("private-user-42", 7)
	erin.WaitFor(erinAt, msg("private-user-42", s7, 7, false))
	b.Shot("authz-browser")
}
