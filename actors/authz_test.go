package actors

import (
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwt"

	"github.com/relayhq/relay/api/backend"
	"github.com/relayhq/relay/proto"
)

const (
	authSecret = "current-secret"
	oldSecret  = "previous-secret"
)

var authT0 = time.Unix(1_800_000_000, 0)

func connToken(t *testing.T, sub string, ttl time.Duration, channels map[string][]string) string {
	t.Helper()
	tok, err := backend.MintConnectionToken(backend.ConnectionTokenOptions{Secret: authSecret, UserID: sub, TTL: ttl, Channels: channels, Now: authT0})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func subToken(t *testing.T, o backend.SubscribeTokenOptions) string {
	t.Helper()
	if o.Secret == "" {
		o.Secret = authSecret
	}
	if o.TTL == 0 {
		o.TTL = time.Minute
	}
	if o.Now.IsZero() {
		o.Now = authT0
	}
	tok, err := backend.MintSubscribeToken(o)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// signed signs claims as given, with alg (HS256 unless said).
func signed(t *testing.T, claims map[string]any, alg jwa.SignatureAlgorithm, secret string) string {
	t.Helper()
	b := jwt.NewBuilder()
	for k, v := range claims {
		b = b.Claim(k, v)
	}
	tok, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	out, err := jwt.Sign(tok, jwt.WithKey(alg, []byte(secret)))
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func TestVerifyConnectionToken(t *testing.T) {
	secrets := []string{authSecret}
	exp := authT0.Add(time.Hour).Unix()
	id, err := VerifyConnectionToken(connToken(t, "user-42", time.Hour, map[string][]string{"private-user-42": {"subscribe", "presence"}}), secrets, authT0)
	if err != nil || id.Sub != "user-42" || id.Exp().Unix() != exp || !id.allows("private-user-42", true) || id.allows("private-user-43", false) {
		t.Fatalf("a good token: %+v, %v", id, err)
	}
	refused := map[string]struct {
		token string
		want  error
	}{
		"expired":         {connToken(t, "u", time.Second, nil), ErrTokenExpired},
		"another secret":  {signed(t, map[string]any{"sub": "u", "exp": exp}, jwa.HS256, "other"), ErrInvalidToken},
		"HS512":           {signed(t, map[string]any{"sub": "u", "exp": exp}, jwa.HS512, authSecret), ErrInvalidToken},
		"no exp":          {signed(t, map[string]any{"sub": "u"}, jwa.HS256, authSecret), ErrInvalidToken},
		"no sub":          {signed(t, map[string]any{"exp": exp}, jwa.HS256, authSecret), ErrInvalidToken},
		"sub too long":    {signed(t, map[string]any{"sub": strings.Repeat("u", 129), "exp": exp}, jwa.HS256, authSecret), ErrInvalidToken},
		"channels a list": {signed(t, map[string]any{"sub": "u", "exp": exp, "channels": []string{"a"}}, jwa.HS256, authSecret), ErrInvalidToken},
		"unknown right":   {signed(t, map[string]any{"sub": "u", "exp": exp, "channels": map[string]any{"a": []string{"emit"}}}, jwa.HS256, authSecret), ErrInvalidToken},
		"not a JWT":       {"not.a.jwt", ErrInvalidToken},
		"unsigned":        {"eyJhbGciOiJub25lIn0.eyJzdWIiOiJ1IiwiZXhwIjo5OTk5OTk5OTk5fQ.", ErrInvalidToken},
		"101 grants":      {signed(t, map[string]any{"sub": "u", "exp": exp, "channels": grants(101)}, jwa.HS256, authSecret), ErrInvalidToken},
	}
	if id, err := VerifyConnectionToken(signed(t, map[string]any{"sub": "u", "exp": exp, "channels": grants(100)}, jwa.HS256, authSecret), secrets, authT0); err != nil ||
		!id.allows("private-c99", false) || id.allows("private-c100", false) {
		t.Fatalf("a token of 100 grants (the most): %v", err)
	}
	for name, c := range refused {
		if _, err := VerifyConnectionToken(c.token, secrets, authT0.Add(10*time.Second)); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
}

// grants is a channels claim of n grants, private-c0 to private-c{n-1}.
func grants(n int) map[string]any {
	g := make(map[string]any, n)
	for i := range n {
		g["private-c"+strconv.Itoa(i)] = []string{"subscribe"}
	}
	return g
}

// The rules of a project with authorization on, one subscribe at a time.
func TestAuthorizeSubscribe(t *testing.T) {
	az := &ProjectAuthz{On: true, Secrets: []string{authSecret, oldSecret}, PreviousUntil: authT0.Add(time.Minute), Private: []string{"vault", "team-*"}}
	user := func(channels map[string][]string) *Identity {
		id, err := VerifyConnectionToken(connToken(t, "ann", time.Hour, channels), az.Secrets, authT0)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	ann := user(map[string][]string{"private-ann": {"subscribe", "presence"}, "private-team-*": {"subscribe"}, "team-*": {"subscribe"}})
	cases := []struct {
		name     string
		id       *Identity
		channel  string
		presence bool
		clientID string
		token    string
		at       time.Duration
		want     proto.Code
	}{
		{name: "public, anonymous", channel: "lobby"},
		{name: "marked private by name, anonymous", channel: "vault", want: proto.CodeChannelForbidden},
		{name: "marked private by prefix, anonymous", channel: "team-7", want: proto.CodeChannelForbidden},
		{name: "not under the marked prefix", channel: "teams"},
		{name: "not the marked name", channel: "vault2"},
		{name: "marked private, granted by prefix", id: ann, channel: "team-7"},
		{name: "public presence, anonymous", channel: "lobby", presence: true, clientID: "ann", want: proto.CodeTokenRequired},
		{name: "public presence, another clientId", id: ann, channel: "lobby", presence: true, clientID: "bob", want: proto.CodeClientIDMismatch},
		{name: "public presence as the token's sub", id: ann, channel: "lobby", presence: true, clientID: "ann"},
		{name: "private, anonymous", channel: "private-ann", want: proto.CodeChannelForbidden},
		{name: "private, no grant", id: ann, channel: "private-bob", want: proto.CodeChannelForbidden},
		{name: "private, granted by name", id: ann, channel: "private-ann"},
		{name: "private presence, granted", id: ann, channel: "private-ann", presence: true, clientID: "ann"},
		{name: "private, granted by prefix", id: ann, channel: "private-team-7"},
		{name: "private presence, prefix grants subscribe only", id: ann, channel: "private-team-7", presence: true, clientID: "ann", want: proto.CodeChannelForbidden},
		{name: "subscribe token", id: ann, channel: "private-doc", token: subToken(t, backend.SubscribeTokenOptions{Channel: "private-doc"})},
		{name: "subscribe token, anonymous", channel: "private-doc", token: subToken(t, backend.SubscribeTokenOptions{Channel: "private-doc"})},
		{name: "subscribe token for the user", id: ann, channel: "private-doc", token: subToken(t, backend.SubscribeTokenOptions{Channel: "private-doc", UserID: "ann"})},
		{name: "subscribe token for another user", id: ann, channel: "private-doc", token: subToken(t, backend.SubscribeTokenOptions{Channel: "private-doc", UserID: "bob"}), want: proto.CodeInvalidSubscribeToken},
		{name: "subscribe token with a sub, anonymous", channel: "private-doc", token: subToken(t, backend.SubscribeTokenOptions{Channel: "private-doc", UserID: "ann"}), want: proto.CodeInvalidSubscribeToken},
		{name: "subscribe token for another channel", id: ann, channel: "private-doc", token: subToken(t, backend.SubscribeTokenOptions{Channel: "private-doc2"}), want: proto.CodeInvalidSubscribeToken},
		{name: "subscribe token expired", id: ann, channel: "private-doc", token: subToken(t, backend.SubscribeTokenOptions{Channel: "private-doc"}), at: time.Hour, want: proto.CodeInvalidSubscribeToken},
		{name: "subscribe token of another secret", id: ann, channel: "private-doc", token: subToken(t, backend.SubscribeTokenOptions{Channel: "private-doc", Secret: "other"}), want: proto.CodeInvalidSubscribeToken},
		{name: "subscribe token of the previous secret, in its overlap", id: ann, channel: "private-doc", token: subToken(t, backend.SubscribeTokenOptions{Channel: "private-doc", Secret: oldSecret})},
		{name: "subscribe token of the previous secret, after its overlap", id: ann, channel: "private-doc", at: 2 * time.Minute,
			token: subToken(t, backend.SubscribeTokenOptions{Channel: "private-doc", Secret: oldSecret, TTL: time.Hour}), want: proto.CodeInvalidSubscribeToken},
		{name: "subscribe token with presence", id: ann, channel: "private-doc", presence: true, clientID: "ann", token: subToken(t, backend.SubscribeTokenOptions{Channel: "private-doc", Presence: true})},
		{name: "subscribe token without presence", id: ann, channel: "private-doc", presence: true, clientID: "ann", token: subToken(t, backend.SubscribeTokenOptions{Channel: "private-doc"}), want: proto.CodeChannelForbidden},
	}
	for _, c := range cases {
		m := &proto.ClientMessage{Action: proto.ActionSubscribe, Channel: c.channel, Presence: c.presence, ClientID: c.clientID, Token: c.token}
		if got := authorizeSubscribe(context.Background(), nil, az, c.id, m, authT0.Add(c.at)); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// authzSystem is a node whose project p has authorization on, on a clock the test moves.
func authzSystem(t *testing.T, on bool) (*System, *atomic.Int64) {
	var clock atomic.Int64
	clock.Store(authT0.UnixNano())
	sys := newTestSystem(t, Config{
		Now: func() time.Time { return time.Unix(0, clock.Load()) },
		LoadSettings: func(context.Context, string) (Settings, error) {
			return Settings{Authz: ProjectAuthz{On: on, Secrets: []string{authSecret}}}, nil
		},
	})
	return sys, &clock
}

// openWithToken opens a connection to p as the handshake would.
func openWithToken(t *testing.T, sys *System, k *sink, token string) *Session {
	t.Helper()
	l, ok := sys.Reserve("p", "addr")
	if !ok {
		t.Fatal("reserve refused")
	}
	az := &ProjectAuthz{On: true, Secrets: []string{authSecret}}
	var id *Identity
	if token != "" {
		var err error
		if id, err = VerifyConnectionToken(token, az.Secrets, sys.cfg.Now()); err != nil {
			t.Fatal(err)
		}
	}
	return sys.OpenAuthorized(l, "key", k, az, id)
}

func lastFrame(t *testing.T, k *sink, n int) map[string]any {
	t.Helper()
	waitFor(t, "frame", func() bool { return len(k.messages(t)) >= n })
	return k.messages(t)[n-1]
}

// A connection on a project with authorization on: refused subscribes get
// their named error and leave nothing behind; the token is refreshed
// without reconnecting; a token that expires is told, then closed with 4011.
func TestConnectionTokenOnAConnection(t *testing.T) {
	sys, clock := authzSystem(t, true)
	k := &sink{id: 1}
	sess := openWithToken(t, sys, k, connToken(t, "ann", time.Hour, map[string][]string{"private-ann": {"subscribe"}}))
	sess.HandleMessage([]byte(`{"action":"subscribe","channel":"private-bob"}`))
	if m := lastFrame(t, k, 1); m["error"] != "channel_forbidden" || m["channel"] != "private-bob" {
		t.Fatalf("got %v", m)
	}
	sess.HandleMessage([]byte(`{"action":"subscribe","channel":"lobby","presence":true,"clientId":"bob"}`))
	if m := lastFrame(t, k, 2); m["error"] != "client_id_mismatch" || m["channel"] != "lobby" {
		t.Fatalf("got %v", m)
	}
	sess.HandleMessage([]byte(`{"action":"subscribe","channel":"private-ann"}`))
	if m := lastFrame(t, k, 3); m["ok"] != true || m["channel"] != "private-ann" {
		t.Fatalf("got %v", m)
	}
	if res, err := sys.Publish(context.Background(), "p", "private-bob", []byte(`1`)); err != nil || res.Subscribers != 0 {
		t.Fatalf("the refused subscribe left a subscriber: %+v %v", res, err)
	}

	// Refresh: another user's token is refused, the same user's taken.
	sess.HandleMessage([]byte(`{"action":"refresh","token":"` + connToken(t, "bob", 2*time.Hour, nil) + `"}`))
	if m := lastFrame(t, k, 4); m["error"] != "invalid_token" || len(m) != 1 {
		t.Fatalf("got %v", m)
	}
	sess.HandleMessage([]byte(`{"action":"refresh","token":"` + connToken(t, "ann", 2*time.Hour, map[string][]string{"private-*": {"subscribe"}}) + `"}`))
	if m := lastFrame(t, k, 5); m["action"] != "refresh" || m["ok"] != true {
		t.Fatalf("got %v", m)
	}
	sess.HandleMessage([]byte(`{"action":"subscribe","channel":"private-bob"}`)) // the new grants apply
	if m := lastFrame(t, k, 6); m["ok"] != true {
		t.Fatalf("got %v", m)
	}

	// The refreshed token expires 2 h after t0: told 30 s before, closed after.
	clock.Store(authT0.Add(2*time.Hour - 20*time.Second).UnixNano())
	waitFor(t, "token_expiring", func() bool {
		ms := k.messages(t)
		return len(ms) == 7 && ms[6]["type"] == "token_expiring" && ms[6]["exp"] == float64(authT0.Add(2*time.Hour).Unix())
	})
	if k.closed.Load() != 0 {
		t.Fatal("closed before its token expired")
	}
	clock.Store(authT0.Add(2*time.Hour + tokenSkew).UnixNano())
	waitFor(t, "close 4011", func() bool { return k.closed.Load() == proto.CloseTokenExpired })
}

// A project without authorization sees the protocol as before: private-
// channels are channels, any clientId joins presence, refresh is unknown.
func TestAuthorizationOffChangesNothing(t *testing.T) {
	sys, _ := authzSystem(t, false)
	k := &sink{id: 1}
	sess := openConn(sys, "p", k)
	sess.HandleMessage([]byte(`{"action":"subscribe","channel":"private-x","presence":true,"clientId":"anyone","token":"junk"}`))
	sess.HandleMessage([]byte(`{"action":"refresh","token":"junk"}`))
	waitFor(t, "answers", func() bool { return len(k.messages(t)) == 3 })
	var got []string // the refresh's answer comes from the connection, the others from the channel
	for _, m := range k.messages(t) {
		switch {
		case m["ok"] == true && m["channel"] == "private-x":
			got = append(got, "ack")
		case m["event"] == "sync":
			got = append(got, "sync")
		case m["error"] == "unknown_action" && len(m) == 1:
			got = append(got, "unknown_action")
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"ack", "sync", "unknown_action"}) {
		t.Fatalf("got %v", k.messages(t))
	}
}

// Revocations of a user's tokens cover the connections already open: one
// that opened while the project's settings (and their revocations) were
// still loading, one that never subscribed under the user's clientId, and
// a later, shorter client-emit revocation of that clientId does not end the
// user's revocation early.
func TestUserRevocationCoversOpenConnections(t *testing.T) {
	var clock atomic.Int64
	clock.Store(authT0.Add(time.Minute).UnixNano())
	gate := make(chan struct{})
	revokedAt := authT0.Add(30 * time.Second) // after the tokens' iat (authT0)
	sys := newTestSystem(t, Config{
		Now: func() time.Time { return time.Unix(0, clock.Load()) },
		LoadSettings: func(ctx context.Context, _ string) (Settings, error) {
			<-gate
			return Settings{Authz: ProjectAuthz{On: true, Secrets: []string{authSecret}},
				Revocations: []Revocation{{Kind: RevokeClient, Value: "ann", RevokedAt: revokedAt, ExpiresAt: revokedAt.Add(24 * time.Hour)}}}, nil
		},
	})
	loading := &sink{id: 1}
	openWithToken(t, sys, loading, connToken(t, "ann", time.Hour, nil)) // opened while the settings load
	other := &sink{id: 2}
	openWithToken(t, sys, other, connToken(t, "bob", time.Hour, nil))
	close(gate)
	waitFor(t, "4012 for the connection opened while loading", func() bool { return loading.closed.Load() == proto.CloseTokenRevoked })

	quiet := &sink{id: 3} // never subscribes: no disconnect would find it
	openWithToken(t, sys, quiet, connToken(t, "carl", time.Hour, nil))
	sys.Revoke("p", []Revocation{{Kind: RevokeClient, Value: "carl", RevokedAt: authT0.Add(time.Minute), ExpiresAt: authT0.Add(24 * time.Hour)}})
	waitFor(t, "4012 for a connection without subscriptions", func() bool { return quiet.closed.Load() == proto.CloseTokenRevoked })
	if other.closed.Load() != 0 {
		t.Fatalf("another user's connection closed with %d", other.closed.Load())
	}

	// A shorter revocation of ann (a client-emit revoke, minutes long) keeps the day-long end.
	sys.Revoke("p", []Revocation{{Kind: RevokeClient, Value: "ann", RevokedAt: authT0.Add(2 * time.Minute), ExpiresAt: authT0.Add(12 * time.Minute)}})
	clock.Store(authT0.Add(time.Hour).UnixNano()) // past the short one's end, before the day's
	again := &sink{id: 4}
	openWithToken(t, sys, again, connToken(t, "ann", 2*time.Hour, nil))
	waitFor(t, "4012 an hour later", func() bool { return again.closed.Load() == proto.CloseTokenRevoked })
}

// A refresh with a token a revocation of its user covers (issued before
// it) closes the connection 4012, with no refresh ok before the close; a
// token issued after the revocation refreshes as usual.
func TestRefreshWithARevokedToken(t *testing.T) {
	sys, clock := authzSystem(t, true)
	clock.Store(authT0.Add(3 * time.Minute).UnixNano())
	after := func() string { // dan's token issued after the revocation
		t.Helper()
		tok, err := backend.MintConnectionToken(backend.ConnectionTokenOptions{Secret: authSecret, UserID: "dan", TTL: time.Hour, Now: authT0.Add(2 * time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	fresh := &sink{id: 1}
	sess := openWithToken(t, sys, fresh, after())
	old := &sink{id: 2}
	openWithToken(t, sys, old, connToken(t, "dan", time.Hour, nil))
	sys.Revoke("p", []Revocation{{Kind: RevokeClient, Value: "dan", RevokedAt: authT0.Add(time.Minute), ExpiresAt: authT0.Add(24 * time.Hour)}})
	waitFor(t, "4012 for the connection of a token issued before the revocation", func() bool { return old.closed.Load() == proto.CloseTokenRevoked })
	if fresh.closed.Load() != 0 {
		t.Fatalf("the connection of a token issued after the revocation closed with %d", fresh.closed.Load())
	}
	sess.HandleMessage([]byte(`{"action":"refresh","token":"` + after() + `"}`))
	if m := lastFrame(t, fresh, 1); m["action"] != "refresh" || m["ok"] != true {
		t.Fatalf("a refresh with a token issued after the revocation: %v", m)
	}
	sess.HandleMessage([]byte(`{"action":"refresh","token":"` + connToken(t, "dan", 2*time.Hour, nil) + `"}`))
	waitFor(t, "4012 after a refresh with a revoked token", func() bool { return fresh.closed.Load() == proto.CloseTokenRevoked })
	if m := fresh.messages(t); len(m) != 1 {
		t.Fatalf("frames before the close: %v, want only the first refresh's ok", m)
	}
}

// A project that turns authorization off and on again still expires the
// tokens of its connections.
func TestExpiryKeptWhileOff(t *testing.T) {
	var clock atomic.Int64
	clock.Store(authT0.UnixNano())
	var on atomic.Bool // the stored setting
	on.Store(true)
	sys := newTestSystem(t, Config{
		Now: func() time.Time { return time.Unix(0, clock.Load()) },
		LoadSettings: func(context.Context, string) (Settings, error) {
			return Settings{Authz: ProjectAuthz{On: on.Load(), Secrets: []string{authSecret}}}, nil
		},
	})
	k := &sink{id: 1}
	openWithToken(t, sys, k, connToken(t, "ann", time.Hour, nil))
	set := func(v bool) {
		on.Store(v)
		sys.AuthorizationChanged(context.Background(), "p", ProjectAuthz{On: v, Secrets: []string{authSecret}})
	}
	set(false)
	clock.Store(authT0.Add(2 * time.Hour).UnixNano()) // expired while off: nothing happens
	set(false)                                        // the actor checks the tokens (as at a tick) before it answers
	if k.closed.Load() != 0 {
		t.Fatalf("closed %d while authorization was off", k.closed.Load())
	}
	set(true)
	waitFor(t, "4011 once on again", func() bool { return k.closed.Load() == proto.CloseTokenExpired })
}

// An exp far in the future is not read as the past (it counts as the last
// second 32 bits hold), an iat before 1970 as 1970 (covered by any
// revocation, as a token without iat), and a subscribe token (it has ch)
// is no connection token.
func TestConnectionTokenEdges(t *testing.T) {
	far := signed(t, map[string]any{"sub": "u", "exp": 1e13, "iat": -5}, jwa.HS256, authSecret)
	id, err := VerifyConnectionToken(far, []string{authSecret}, authT0)
	if err != nil {
		t.Fatalf("exp 1e13: %v", err)
	}
	if got, want := id.Exp(), time.Unix(math.MaxUint32, 0); !got.Equal(want) || id.iat != 0 {
		t.Fatalf("exp 1e13, iat -5 read as %v and %d, want %v and 0", got, id.iat, want)
	}
	near := signed(t, map[string]any{"sub": "u", "exp": authT0.Unix() + 60, "iat": authT0.Unix()}, jwa.HS256, authSecret)
	if id, err = VerifyConnectionToken(near, []string{authSecret}, authT0); err != nil {
		t.Fatal(err)
	}
	if id.Exp().Unix() != authT0.Unix()+60 || int64(id.iat) != authT0.Unix() {
		t.Fatalf("exp and iat read as %v, %d", id.Exp(), id.iat)
	}
	sub := subToken(t, backend.SubscribeTokenOptions{Channel: "private-doc", UserID: "u"})
	if _, err := VerifyConnectionToken(sub, []string{authSecret}, authT0); !errors.Is(err, ErrInvalidToken) {
		t.Fatalf("a subscribe token as a connection token: %v", err)
	}
}
