package relaytest

import (
	"testing"
	"time"

	"github.com/relayhq/relay/api/backend"
)

// ClientEmitSetup is a project with a client-emit secret and a presence
// subscriber "ann" on channel "chat", plus a plain listener.
type ClientEmitSetup struct {
	Server   *Server
	Owner    *Client
	Project  Project
	Secret   string
	Ann      *WS
	Listener *WS
}

// NewClientEmitSetup makes the setup on the running relay ts: alice's
// project "demo", its listener and ann on chat (the secret: Enable).
func NewClientEmitSetup(t testing.TB, ts *Server) *ClientEmitSetup {
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	s := &ClientEmitSetup{Server: ts, Owner: owner, Project: p}
	s.Listener = ts.Subscribed(t, p.PublicKey, "chat")
	s.Ann = ts.PresenceSub(t, p.PublicKey, "chat", "ann")
	s.Ann.Expect(`{"type":"presence","channel":"chat","event":"sync","members":[]}`)
	return s
}

// Enable sets the project's client-emit secret.
func (s *ClientEmitSetup) Enable(t testing.TB) {
	r := s.Owner.Do("PATCH", "/api/projects/"+s.Project.ID+"/client-emit-secret", `{}`)
	s.Secret = r.Str("clientEmitSecret")
	if r.Status != 200 || len(s.Secret) < 32 {
		t.Fatalf("client-emit secret: %d %s", r.Status, r.Raw)
	}
}

// Token mints a token of ann for "msg" on chat, issued now on the server's
// clock, as mod changes it.
func (s *ClientEmitSetup) Token(t testing.TB, mod func(*backend.TokenOptions)) string {
	o := backend.TokenOptions{Secret: s.Secret, ProjectID: s.Project.ID, Channel: "chat", ClientID: "ann", Types: []string{"msg"}, TTL: time.Minute, Now: s.Server.Now()}
	if mod != nil {
		mod(&o)
	}
	tok, err := backend.MintClientEmitToken(o)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TokenFor is a token of clientID for "msg" on chat, issued now on the
// wall clock.
func (s *ClientEmitSetup) TokenFor(clientID string) string {
	tok, _ := backend.MintClientEmitToken(backend.TokenOptions{Secret: s.Secret, ProjectID: s.Project.ID, Channel: "chat", ClientID: clientID, Types: []string{"msg"}, TTL: time.Minute})
	return tok
}
