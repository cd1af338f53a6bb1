package wire

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// A re-subscribe refused by the presence cap leaves the earlier subscription
// as it was, on the channel and on the connection alike: the unsubscribe
// that follows ends it. (The connection used to forget the channel while the
// channel kept it: the unsubscribe was acked without reaching the channel,
// and messages kept coming.)
func TestRefusedResubscribeKeepsTheEarlierSubscription(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), map[string]string{"MAX_PRESENCE_MEMBERS_PER_CHANNEL": "1"})
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("a")
	ts.PresenceSub(t, p.PublicKey, "room", "first").Expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)

	c := ts.DialWS(p.PublicKey)
	c.Send(`{"action":"subscribe","channel":"room"}`)
	c.Expect(`{"action":"subscribe","channel":"room","ok":true}`)
	c.Send(`{"action":"subscribe","channel":"room","presence":true,"clientId":"second"}`)
	c.Expect(`{"error":"too_many_presence_members","channel":"room"}`)
	c.Send(`{"action":"unsubscribe","channel":"room"}`)
	c.Expect(`{"action":"unsubscribe","channel":"room","ok":true}`)

	r := owner.Emit(p.SecretKey, `{"channel":"room","payload":1}`)
	if r.Status != http.StatusOK {
		t.Fatalf("emit: %d %s", r.Status, r.Raw)
	}
	if n := relaytest.Num(r.JSON, "subscriberCount"); n != 1 {
		t.Errorf("subscriberCount %v after unsubscribe, want 1 (the presence member only)", n)
	}
	c.ExpectSilence(300 * time.Millisecond) // unsubscribed: nothing may arrive
}

// The same refusal leaves no ghost presence member: once every socket of
// clientId "x" has closed, "x" is no longer listed. (It used to stay, with no
// leave sent: the closing connection did not name the channel.)
func TestRefusedResubscribeLeavesNoGhostMember(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), map[string]string{"MAX_PRESENCE_MEMBERS_PER_CHANNEL": "1"})
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("a")
	a := ts.PresenceSub(t, p.PublicKey, "room", "x")
	a.Expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
	b := ts.PresenceSub(t, p.PublicKey, "room", "x")
	b.Expect(`{"type":"presence","channel":"room","event":"sync","members":["x"]}`)
	a.Send(`{"action":"subscribe","channel":"room","presence":true,"clientId":"y"}`)
	a.Expect(`{"error":"too_many_presence_members","channel":"room"}`)
	a.Conn.Close()
	b.Conn.Close()
	relaytest.EventuallyNil(t, 3*time.Second, func() error {
		if r := owner.BearerGet("/channels/room/members", p.SecretKey); strings.TrimSpace(r.Raw) != `{"channel":"room","members":[]}` {
			return fmt.Errorf("after every socket closed, members: %s", r.Raw)
		}
		return nil
	})
}

// Client-emit rule 4 holds for an emit sent right behind a presence
// subscribe the channel refuses: emit_identity_mismatch, nothing relayed.
// (The connection checks its own record, which holds the subscribe from the
// moment it is sent; the channel now checks again.)
func TestEmitAfterARefusedPresenceSubscribe(t *testing.T) {
	t.Parallel()
	s := relaytest.NewClientEmitSetup(t, relaytest.Start(t, storetest.SQLiteURL(t), map[string]string{"MAX_PRESENCE_MEMBERS_PER_CHANNEL": "1"}))
	s.Enable(t)
	for i := 0; i < 10; i++ {
		bob := s.Server.DialWS(s.Project.PublicKey)
		bob.Send(`{"action":"subscribe","channel":"chat","presence":true,"clientId":"bob"}`)
		bob.Send(relaytest.EmitFrame("chat", "msg", "1", s.TokenFor("bob")))
		bob.Expect(`{"error":"too_many_presence_members","channel":"chat"}`)
		f, ok := bob.Next(2 * time.Second)
		if !ok || f.Text != `{"error":"emit_identity_mismatch","channel":"chat"}` {
			t.Fatalf("round %d: emit by a refused subscriber answered %+v (ok=%v), want emit_identity_mismatch", i, f, ok)
		}
		s.Listener.ExpectSilence(100 * time.Millisecond)
		bob.Conn.Close()
	}
}

// A presence subscribe refused by the cap gets its error and nothing of the
// replay (nor a replay_gap) a subscribe would have had.
func TestRefusedSubscribeGetsNoReplay(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), map[string]string{"MAX_PRESENCE_MEMBERS_PER_CHANNEL": "1"})
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("a")
	ts.PresenceSub(t, p.PublicKey, "room", "x").Expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
	if r := owner.Emit(p.SecretKey, `{"channel":"room","payload":"secret-ish"}`); r.Status != http.StatusOK {
		t.Fatalf("emit: %d %s", r.Status, r.Raw)
	}
	c := ts.DialWS(p.PublicKey)
	c.Send(`{"action":"subscribe","channel":"room","presence":true,"clientId":"y","since":0}`)
	c.Expect(`{"error":"too_many_presence_members","channel":"room"}`)
}
