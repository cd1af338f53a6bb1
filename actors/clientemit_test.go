package actors

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwt"
)

func mintForTest(t *testing.T, secret, project, channel, clientID string, now time.Time) string {
	t.Helper()
	tok, err := jwt.NewBuilder().Claim("pid", project).Claim("ch", channel).Claim("clientId", clientID).
		Claim("types", []string{"msg"}).JwtID("j1").IssuedAt(now).Expiration(now.Add(time.Minute)).Build()
	if err != nil {
		t.Fatal(err)
	}
	b, err := jwt.Sign(tok, jwt.WithKey(jwa.HS256, []byte(secret)))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestClientEmitAnswersInEmitOrder: one connection bursts emits on a
// channel; the accepted ones are answered by the channel actor, the refused
// ones (rule 3 and the per-clientId cap, rule 6) by the project actor. The
// answers must still come back in the order of the emits, which is how the
// reference clients pair them.
func TestClientEmitAnswersInEmitOrder(t *testing.T) {
	now := time.Now()
	const secret = "0123456789abcdef0123456789abcdef"
	sys := newTestSystem(t, Config{
		ClientEmitRatePerSecond: 3,
		Now:                     func() time.Time { return now }, // one 1-second window throughout
		LoadSettings: func(context.Context, string) (Settings, error) {
			return Settings{ClientEmitSecret: secret}, nil
		},
	})
	k := &sink{id: 1}
	sess := openConn(sys, "p", k)
	sess.HandleMessage([]byte(`{"action":"subscribe","channel":"c","presence":true,"clientId":"ann"}`))
	waitFor(t, "ack and sync", func() bool { return len(k.messages(t)) == 2 })

	tok := mintForTest(t, secret, "p", "c", "ann", now)
	const n = 60
	var want []string
	accepted := 0
	for i := range n {
		typ := "msg"
		switch {
		case i%4 == 3:
			typ = "other" // not in the token's types: rule 3
			want = append(want, "invalid_emit_token")
		case accepted < 3:
			accepted++
			want = append(want, "ack")
		default:
			want = append(want, "client_emit_rate_limited")
		}
		sess.HandleMessage(fmt.Appendf(nil, `{"action":"emit","channel":"c","type":%q,"payload":%d,"token":%q}`, typ, i, tok))
	}
	waitFor(t, "every answer", func() bool { return len(k.messages(t)) == 2+n })
	var lastSeq float64
	for i, m := range k.messages(t)[2:] {
		got, _ := m["error"].(string)
		if m["action"] == "emit" && m["ok"] == true {
			got = "ack"
			seq, _ := m["seq"].(float64)
			if seq <= lastSeq {
				t.Errorf("answer %d: seq %v after %v", i, seq, lastSeq)
			}
			lastSeq = seq
		} else if m["channel"] != "c" {
			t.Errorf("answer %d: %v has no channel", i, m)
		}
		if got != want[i] {
			t.Fatalf("answer %d is %v, want %s (answers must follow the emits' order)", i, m, want[i])
		}
	}
}
