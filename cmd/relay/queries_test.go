package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/api/backend"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// resetAtOf is the resetAt every budget shows at clock time now.
func resetAtOf(now time.Time) string {
	return now.UTC().Truncate(time.Minute).Add(time.Minute).Format("2006-01-02T15:04:05.000Z")
}

func budgetJSON(limit, remaining int, reset string) string {
	return fmt.Sprintf(`{"limit":%d,"remaining":%d,"resetAt":%q}`, limit, remaining, reset)
}

// TestQueriesChannels covers occupancy, one channel's counts, its members
// and its messages, with every error they can give.
func TestQueriesChannels(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, url string) {
		clock := newClock()
		ts := startServerAt(t, url, nil, clock.Now)
		owner := ts.Signup("alice@example.com")
		p := owner.CreateProject("demo")
		other := owner.CreateProject("other")
		c := ts.Client()

		// Authentication, as POST /emit.
		for _, path := range []string{"/channels", "/channels/room", "/channels/room/members", "/channels/room/messages"} {
			c.BearerGet(path, "").Expect(t, 401, `{"error":"missing_secret_key"}`)
			c.BearerGet(path, p.PublicKey).Expect(t, 401, `{"error":"invalid_secret_key"}`)
			c.Send("POST", path, "", "", map[string]string{"Authorization": "Bearer " + p.SecretKey}).
				Expect(t, 405, `{"error":"method_not_allowed"}`)
		}

		// Nothing live yet.
		c.BearerGet("/channels", p.SecretKey).Expect(t, 200, `{"channels":[],"nextCursor":null}`)
		c.BearerGet("/channels/room", p.SecretKey).Expect(t, 200, `{"channel":"room","subscriberCount":0,"presenceMemberCount":0}`)
		c.BearerGet("/channels/room/members", p.SecretKey).Expect(t, 200, `{"channel":"room","members":[]}`)
		c.BearerGet("/channels/room/messages", p.SecretKey).Expect(t, 200, `{"channel":"room","messages":[],"gap":false}`)

		ts.Subscribed(t, p.PublicKey, "room")
		ann := ts.PresenceSub(t, p.PublicKey, "room", "ann")
		ann.Expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
		bob := ts.PresenceSub(t, p.PublicKey, "room", "bob")
		bob.Expect(`{"type":"presence","channel":"room","event":"sync","members":["ann"]}`)
		bob2 := ts.PresenceSub(t, p.PublicKey, "room", "bob")
		bob2.Expect(`{"type":"presence","channel":"room","event":"sync","members":["ann","bob"]}`)
		ts.Subscribed(t, p.PublicKey, "lobby")
		ts.Subscribed(t, other.PublicKey, "room")
		// A channel that only ever had an emit is live but has no subscribers.
		owner.Emit(p.SecretKey, `{"channel":"quiet","payload":1}`)

		c.BearerGet("/channels", p.SecretKey).Expect(t, 200,
			`{"channels":[{"channel":"lobby","subscriberCount":1},{"channel":"room","subscriberCount":4}],"nextCursor":null}`)
		c.BearerGet("/channels?limit=1", p.SecretKey).Expect(t, 200,
			`{"channels":[{"channel":"lobby","subscriberCount":1}],"nextCursor":"lobby"}`)
		c.BearerGet("/channels?limit=1&cursor=lobby", p.SecretKey).Expect(t, 200,
			`{"channels":[{"channel":"room","subscriberCount":4}],"nextCursor":null}`)
		c.BearerGet("/channels?cursor=room", p.SecretKey).Expect(t, 200, `{"channels":[],"nextCursor":null}`)
		c.BearerGet("/channels", other.SecretKey).Expect(t, 200,
			`{"channels":[{"channel":"room","subscriberCount":1}],"nextCursor":null}`)
		for _, q := range []string{"limit=0", "limit=1001", "limit=x", "limit="} {
			c.BearerGet("/channels?"+q, p.SecretKey).Expect(t, 400, `{"error":"invalid_query","param":"limit"}`)
		}
		c.BearerGet("/channels?cursor=a%2Fb", p.SecretKey).Expect(t, 400, `{"error":"invalid_query","param":"cursor"}`)

		c.BearerGet("/channels/room", p.SecretKey).Expect(t, 200, `{"channel":"room","subscriberCount":4,"presenceMemberCount":2}`)
		c.BearerGet("/channels/room", other.SecretKey).Expect(t, 200, `{"channel":"room","subscriberCount":1,"presenceMemberCount":0}`)
		c.BearerGet("/channels/room/members", p.SecretKey).Expect(t, 200, `{"channel":"room","members":["ann","bob"]}`)
		c.BearerGet("/channels/lobby/members", p.SecretKey).Expect(t, 200, `{"channel":"lobby","members":[]}`)
		long := strings.Repeat("x", 201)
		for _, path := range []string{"/channels/bad!", "/channels/bad!/members", "/channels/bad!/messages", "/channels/" + long} {
			name := strings.TrimPrefix(strings.TrimSuffix(strings.TrimSuffix(path, "/members"), "/messages"), "/channels/")
			c.BearerGet(path, p.SecretKey).Expect(t, 400, `{"error":"invalid_channel","channel":"`+name+`"}`)
		}
		c.BearerGet("/channels/room/nope", p.SecretKey).Expect(t, 404, `{"error":"not_found"}`)

		// Messages: the replay ring after since, as delivered.
		first := owner.Emit(p.SecretKey, `{"channel":"room","payload":{"n":1}}`)
		second := owner.Emit(p.SecretKey, `{"channel":"room","payload":{"n":2}}`)
		s1, s2 := uint64(relaytest.Num(first.JSON, "seq")), uint64(relaytest.Num(second.JSON, "seq"))
		m1 := fmt.Sprintf(`{"channel":"room","payload":{"n":1},"seq":%d}`, s1)
		m2 := fmt.Sprintf(`{"channel":"room","payload":{"n":2},"seq":%d}`, s2)
		c.BearerGet("/channels/room/messages", p.SecretKey).Expect(t, 200, `{"channel":"room","messages":[`+m1+`,`+m2+`],"gap":false}`)
		c.BearerGet(fmt.Sprintf("/channels/room/messages?since=%d", s1-1), p.SecretKey).Expect(t, 200, `{"channel":"room","messages":[`+m1+`,`+m2+`],"gap":false}`)
		c.BearerGet(fmt.Sprintf("/channels/room/messages?since=%d", s1), p.SecretKey).Expect(t, 200, `{"channel":"room","messages":[`+m2+`],"gap":false}`)
		c.BearerGet(fmt.Sprintf("/channels/room/messages?since=%d", s2), p.SecretKey).Expect(t, 200, `{"channel":"room","messages":[],"gap":false}`)
		// A since older than the ring's start: what followed may be gone.
		c.BearerGet("/channels/room/messages?since=1", p.SecretKey).Expect(t, 200, `{"channel":"room","messages":[`+m1+`,`+m2+`],"gap":true}`)
		// since=0 is a since like any other, older than the buffer (a socket
		// subscribing with it gets replay_gap); none at all asks for no gap.
		c.BearerGet("/channels/room/messages?since=0", p.SecretKey).Expect(t, 200, `{"channel":"room","messages":[`+m1+`,`+m2+`],"gap":true}`)
		c.BearerGet("/channels/room/messages", other.SecretKey).Expect(t, 200, `{"channel":"room","messages":[],"gap":false}`)
		for _, q := range []string{"since=x", "since=", "since=0x10", "since=Inf", "since=NaN", "since=1e400", "since=1_0", "since=%221%22"} {
			c.BearerGet("/channels/room/messages?"+q, p.SecretKey).Expect(t, 400, `{"error":"invalid_since"}`)
		}
		// Any number a socket's subscribe takes (TestSinceSameOnSocketAndHTTP):
		// a negative one and one past every seq, a fraction between two seqs.
		c.BearerGet("/channels/room/messages?since=-1", p.SecretKey).Expect(t, 200, `{"channel":"room","messages":[`+m1+`,`+m2+`],"gap":true}`)
		c.BearerGet("/channels/room/messages?since=9007199254740993", p.SecretKey).Expect(t, 200, `{"channel":"room","messages":[],"gap":false}`)
		c.BearerGet(fmt.Sprintf("/channels/room/messages?since=%d.5", s1), p.SecretKey).Expect(t, 200, `{"channel":"room","messages":[`+m2+`],"gap":false}`)
		// Past the replay TTL the ring is empty and the gap is told.
		clock.Advance(21 * time.Second)
		c.BearerGet(fmt.Sprintf("/channels/room/messages?since=%d", s1), p.SecretKey).Expect(t, 200, `{"channel":"room","messages":[],"gap":true}`)
	})
}

// TestQueriesDisconnect closes every socket of a clientId, with 4003.
func TestQueriesDisconnect(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, nil)
		owner := ts.Signup("alice@example.com")
		p := owner.CreateProject("demo")
		other := owner.CreateProject("other")
		c := ts.Client()
		auth := func(key string) map[string]string { return map[string]string{"Authorization": "Bearer " + key} }

		c.Send("POST", "/clients/ann/disconnect", "", "", nil).Expect(t, 401, `{"error":"missing_secret_key"}`)
		c.Send("POST", "/clients/ann/disconnect", "", "", auth(p.PublicKey)).Expect(t, 401, `{"error":"invalid_secret_key"}`)
		c.Send("GET", "/clients/ann/disconnect", "", "", auth(p.SecretKey)).Expect(t, 405, `{"error":"method_not_allowed"}`)
		c.Send("POST", "/clients/ann/disconnect", "", "", auth(p.SecretKey)).Expect(t, 200, `{"ok":true,"closed":0}`)

		watcher := ts.PresenceSub(t, p.PublicKey, "room", "w")
		watcher.Expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
		tab1 := ts.PresenceSub(t, p.PublicKey, "room", "ann")
		tab1.Expect(`{"type":"presence","channel":"room","event":"sync","members":["w"]}`)
		watcher.Expect(`{"type":"presence","channel":"room","event":"join","clientId":"ann"}`)
		tab2 := ts.PresenceSub(t, p.PublicKey, "room", "ann")
		tab2.Expect(`{"type":"presence","channel":"room","event":"sync","members":["ann","w"]}`)
		// The same socket on a second channel is closed once.
		tab2.Send(`{"action":"subscribe","channel":"doc","presence":true,"clientId":"ann"}`)
		tab2.Expect(`{"action":"subscribe","channel":"doc","ok":true}`)
		tab2.Expect(`{"type":"presence","channel":"doc","event":"sync","members":[]}`)
		otherAnn := ts.PresenceSub(t, other.PublicKey, "room", "ann")
		otherAnn.Expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)

		c.Send("POST", "/clients/ann/disconnect", "", "", auth(p.SecretKey)).Expect(t, 200, `{"ok":true,"closed":2}`)
		f := tab1.ExpectClose(4003, 5*time.Second)
		if f.Reason != "disconnected by the server" {
			t.Fatalf("close reason %q", f.Reason)
		}
		tab2.ExpectClose(4003, 5*time.Second)
		watcher.Expect(`{"type":"presence","channel":"room","event":"leave","clientId":"ann"}`)
		watcher.ExpectSilence(100 * time.Millisecond)
		otherAnn.ExpectSilence(100 * time.Millisecond) // another project's ann stays
		// Answered after the sockets left their channels.
		c.BearerGet("/channels/room", p.SecretKey).Expect(t, 200, `{"channel":"room","subscriberCount":1,"presenceMemberCount":1}`)
		c.BearerGet("/channels/room/members", p.SecretKey).Expect(t, 200, `{"channel":"room","members":["w"]}`)
		c.Send("POST", "/clients/ann/disconnect", "", "", auth(p.SecretKey)).Expect(t, 200, `{"ok":true,"closed":0}`)
		// The client may reconnect.
		again := ts.PresenceSub(t, p.PublicKey, "room", "ann")
		again.Expect(`{"type":"presence","channel":"room","event":"sync","members":["w"]}`)
	})
}

// TestQueriesEmitBatch: each message answered in order as POST /emit
// would, budgets per message.
func TestQueriesEmitBatch(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, url string) {
		clock := newClock()
		ts := startServerAt(t, url, map[string]string{"EMIT_RATE_LIMIT_PER_MINUTE": "2", "PROJECT_RATE_LIMIT_PER_MINUTE": "4"}, clock.Now)
		owner := ts.Signup("alice@example.com")
		p := owner.CreateProject("demo")
		c := ts.Client()
		room := ts.Subscribed(t, p.PublicKey, "room")
		reset := resetAtOf(clock.Now())

		c.BearerPost("/emit/batch", "", `{"messages":[]}`).Expect(t, 401, `{"error":"missing_secret_key"}`)
		c.BearerPost("/emit/batch", p.PublicKey, `{"messages":[]}`).Expect(t, 401, `{"error":"invalid_secret_key"}`)
		c.Send("GET", "/emit/batch", "", "", map[string]string{"Authorization": "Bearer " + p.SecretKey}).Expect(t, 405, `{"error":"method_not_allowed"}`)
		for _, body := range []string{``, `[]`, `{"messages":{}}`, `{"messages":"x"}`, `{`} {
			c.BearerPost("/emit/batch", p.SecretKey, body).Expect(t, 400, `{"error":"invalid_json"}`)
		}
		c.BearerPost("/emit/batch", p.SecretKey, `{"messages":[]}`).Expect(t, 400, `{"error":"invalid_batch","max_messages":100}`)
		c.BearerPost("/emit/batch", p.SecretKey, `{}`).Expect(t, 400, `{"error":"invalid_batch","max_messages":100}`)
		many := strings.TrimSuffix(strings.Repeat(`{"channel":"x","payload":1},`, 101), ",")
		c.BearerPost("/emit/batch", p.SecretKey, `{"messages":[`+many+`]}`).Expect(t, 400, `{"error":"invalid_batch","max_messages":100}`)
		huge := `{"messages":[{"channel":"x","payload":"` + strings.Repeat("a", 4<<20) + `"}]}`
		c.BearerPost("/emit/batch", p.SecretKey, huge).Expect(t, 413, `{"error":"body_too_large","max_bytes":4194304}`)
		// Nothing was emitted by the refused batches.
		room.ExpectSilence(50 * time.Millisecond)

		big := `"` + strings.Repeat("a", 128<<10) + `"`
		r := c.BearerPost("/emit/batch", p.SecretKey, `{"messages":[
			{"channel":"room","payload":{"n":1}},
			{"channel":"bad!","payload":1},
			{"channel":"room","payload":`+big+`},
			[1],
			{"channel":"room","payload":{"n":2}},
			{"channel":"room","payload":{"n":3}},
			{"channel":"lobby","payload":{"n":4}},
			{"channel":"lobby","payload":{"n":5}},
			{"channel":"lobby","payload":{"n":6}}
		]}`)
		seq := func(i int) uint64 {
			res, _ := r.JSON["results"].([]any)
			return uint64(relaytest.Num(res[i].(map[string]any), "seq"))
		}
		if r.Status != 200 {
			t.Fatalf("batch: %d %s", r.Status, r.Raw)
		}
		s0, s4, s6, s7 := seq(0), seq(4), seq(6), seq(7)
		r.Expect(t, 200, `{"results":[`+
			fmt.Sprintf(`{"ok":true,"channel":"room","seq":%d,"delivered":1,"subscriberCount":1,"rate_limit":%s,"project_rate_limit":%s},`, s0, budgetJSON(2, 1, reset), budgetJSON(4, 3, reset))+
			`{"ok":false,"error":"invalid_channel","channel":"bad!"},`+
			`{"ok":false,"error":"payload_too_large","max_bytes":131072},`+
			`{"ok":false,"error":"invalid_json"},`+
			fmt.Sprintf(`{"ok":true,"channel":"room","seq":%d,"delivered":1,"subscriberCount":1,"rate_limit":%s,"project_rate_limit":%s},`, s4, budgetJSON(2, 0, reset), budgetJSON(4, 2, reset))+
			fmt.Sprintf(`{"ok":false,"error":"channel_rate_limited","channel":"room","rate_limit":%s,"project_rate_limit":%s},`, budgetJSON(2, 0, reset), budgetJSON(4, 2, reset))+
			fmt.Sprintf(`{"ok":true,"channel":"lobby","seq":%d,"delivered":0,"subscriberCount":0,"rate_limit":%s,"project_rate_limit":%s},`, s6, budgetJSON(2, 1, reset), budgetJSON(4, 1, reset))+
			fmt.Sprintf(`{"ok":true,"channel":"lobby","seq":%d,"delivered":0,"subscriberCount":0,"rate_limit":%s,"project_rate_limit":%s},`, s7, budgetJSON(2, 0, reset), budgetJSON(4, 0, reset))+
			fmt.Sprintf(`{"ok":false,"error":"project_rate_limited","channel":"lobby","rate_limit":%s,"project_rate_limit":%s}`, budgetJSON(2, 0, reset), budgetJSON(4, 0, reset))+
			`]}`)
		if s4 != s0+1 || s7 != s6+1 {
			t.Fatalf("seqs %d %d %d %d", s0, s4, s6, s7)
		}
		room.Expect(fmt.Sprintf(`{"channel":"room","payload":{"n":1},"seq":%d}`, s0))
		room.Expect(fmt.Sprintf(`{"channel":"room","payload":{"n":2},"seq":%d}`, s4))
		room.ExpectSilence(50 * time.Millisecond)
		// The budgets a batch spent are the ones POST /emit sees.
		owner.Emit(p.SecretKey, `{"channel":"other","payload":1}`).Expect(t, 429,
			`{"error":"project_rate_limited","rate_limit":`+budgetJSON(2, 2, reset)+`,"project_rate_limit":`+budgetJSON(4, 0, reset)+`}`)
	})
}

// TestQueriesBackendSDK: the Go backend SDK's call for each query.
func TestQueriesBackendSDK(t *testing.T) {
	t.Parallel()
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	p := ts.Signup("alice@example.com").CreateProject("demo")
	ctx := context.Background()
	srv := backend.Server{EmitURL: ts.Base + "/emit", SecretKey: p.SecretKey}

	ann := ts.PresenceSub(t, p.PublicKey, "room", "ann")
	ann.Expect(`{"type":"presence","channel":"room","event":"sync","members":[]}`)
	ts.Subscribed(t, p.PublicKey, "lobby")

	page, err := srv.Channels(ctx, "", 1)
	if err != nil || fmt.Sprint(page) != "{[{lobby 1}] lobby}" {
		t.Fatalf("Channels: %+v %v", page, err)
	}
	if page, err = srv.Channels(ctx, page.NextCursor, 0); err != nil || fmt.Sprint(page) != "{[{room 1}] }" {
		t.Fatalf("Channels after lobby: %+v %v", page, err)
	}
	if st, err := srv.Channel(ctx, "room"); err != nil || st != (backend.ChannelState{Channel: "room", SubscriberCount: 1, PresenceMemberCount: 1}) {
		t.Fatalf("Channel: %+v %v", st, err)
	}
	if m, err := srv.Members(ctx, "room"); err != nil || fmt.Sprint(m) != "[ann]" {
		t.Fatalf("Members: %v %v", m, err)
	}
	res, err := srv.EmitBatch(ctx, []backend.BatchMessage{{Channel: "room", Payload: map[string]int{"n": 1}}, {Channel: "bad!", Payload: 1}})
	if err != nil || len(res) != 2 || !res[0].OK || res[0].Delivered != 1 || res[1].OK || res[1].Error != "invalid_channel" {
		t.Fatalf("EmitBatch: %+v %v", res, err)
	}
	ann.Expect(fmt.Sprintf(`{"channel":"room","payload":{"n":1},"seq":%d}`, res[0].Seq))
	h, err := srv.Messages(ctx, "room", res[0].Seq-1)
	if err != nil || len(h.Messages) != 1 || h.Gap || string(h.Messages[0]) != fmt.Sprintf(`{"channel":"room","payload":{"n":1},"seq":%d}`, res[0].Seq) {
		t.Fatalf("Messages: %+v %v", h, err)
	}
	if n, err := srv.DisconnectClient(ctx, "ann"); err != nil || n != 1 {
		t.Fatalf("DisconnectClient: %d %v", n, err)
	}
	ann.ExpectClose(4003, 5*time.Second)
	_, err = srv.Channel(ctx, "bad!")
	if e, ok := err.(*backend.Error); !ok || e.Status != 400 || e.Code != "invalid_channel" {
		t.Fatalf("Channel(bad!): %v", err)
	}
	_, err = backend.Server{EmitURL: ts.Base + "/emit", SecretKey: "sk_nope"}.Members(ctx, "room")
	if e, ok := err.(*backend.Error); !ok || e.Status != 401 || e.Code != "invalid_secret_key" {
		t.Fatalf("Members with a wrong key: %v", err)
	}
}

// BenchmarkQueriesHTTP: each call end to end over loopback HTTP on one node
// (SQLite), and 100 emits as one batch against 100 POST /emit.
func BenchmarkQueriesHTTP(b *testing.B) {
	ts := startServer(b, storetest.SQLiteURL(b), map[string]string{
		"EMIT_RATE_LIMIT_PER_MINUTE": "100000000", "PROJECT_RATE_LIMIT_PER_MINUTE": "100000000"})
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("bench")
	c := ts.Client()
	key := map[string]string{"Authorization": "Bearer " + p.SecretKey, "Content-Type": "application/json"}
	for i := range 10 {
		s := ts.DialWS(p.PublicKey)
		s.Send(fmt.Sprintf(`{"action":"subscribe","channel":"room","presence":true,"clientId":"u%d"}`, i))
	}
	for range 100 {
		c.Send("POST", "/emit", `{"channel":"room","payload":{"text":"forty bytes of payload, more or less"}}`, "", key)
	}
	get := func(path string) func(b *testing.B) {
		return func(b *testing.B) {
			for b.Loop() {
				if r := c.Send("GET", path, "", "", key); r.Status != 200 {
					b.Fatal(r.Raw)
				}
			}
		}
	}
	b.Run("GET /channels", get("/channels"))
	b.Run("GET /channels/room", get("/channels/room"))
	b.Run("GET /channels/room/members", get("/channels/room/members"))
	b.Run("GET /channels/room/messages (100)", get("/channels/room/messages"))
	b.Run("POST /clients/x/disconnect", func(b *testing.B) {
		for b.Loop() {
			if r := c.Send("POST", "/clients/x/disconnect", "", "", key); r.Status != 200 {
				b.Fatal(r.Raw)
			}
		}
	})
	one := `{"channel":"room","payload":{"text":"forty bytes of payload, more or less"}}`
	b.Run("100 x POST /emit", func(b *testing.B) {
		for b.Loop() {
			for range 100 {
				if r := c.Send("POST", "/emit", one, "", key); r.Status != 200 {
					b.Fatal(r.Raw)
				}
			}
		}
	})
	batch := `{"messages":[` + strings.TrimSuffix(strings.Repeat(one+",", 100), ",") + `]}`
	b.Run("POST /emit/batch (100)", func(b *testing.B) {
		for b.Loop() {
			if r := c.Send("POST", "/emit/batch", batch, "", key); r.Status != 200 {
				b.Fatal(r.Raw)
			}
		}
	})
}
