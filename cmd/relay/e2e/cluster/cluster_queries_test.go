//go:build cluster

package cluster

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
)

// TestClusterQueries: occupancy, counts, members, messages (the ring, and
// the store for a history project) and disconnect through each of three
// nodes agree on the whole cluster.
func TestClusterQueries(t *testing.T) {
	t.Parallel() // checks what happens, not how fast: see doc.go
	cl := startCluster(t, 10*time.Second, []string{"A", "B", "C"})
	a, b, c := cl.nodes[0], cl.nodes[1], cl.nodes[2]
	owner := a.on(t).Signup("alice@example.com")
	p := owner.CreateProject("queries")

	u1, u2, u3 := presenceTrio(t, p.PublicKey, "room", a.on(t), b.on(t), c.on(t))
	b.on(t).Subscribed(t, p.PublicKey, "room")
	c.on(t).Subscribed(t, p.PublicKey, "lobby")
	c.on(t).Subscribed(t, p.PublicKey, "lobby")

	timed := func(n *clusterNode, what string, f func() relaytest.Response) relaytest.Response {
		t.Helper()
		t0 := time.Now()
		r := f()
		t.Logf("%s through %s answered in %v", what, n.name, time.Since(t0).Round(time.Microsecond))
		return r
	}
	for _, n := range cl.nodes {
		hc := n.on(t).Client()
		timed(n, "GET /channels", func() relaytest.Response { return hc.BearerGet("/channels", p.SecretKey) }).Expect(t, 200,
			`{"channels":[{"channel":"lobby","subscriberCount":2},{"channel":"room","subscriberCount":4}],"nextCursor":null}`)
		hc.BearerGet("/channels?limit=1", p.SecretKey).Expect(t, 200,
			`{"channels":[{"channel":"lobby","subscriberCount":2}],"nextCursor":"lobby"}`)
		timed(n, "GET /channels/room", func() relaytest.Response { return hc.BearerGet("/channels/room", p.SecretKey) }).Expect(t, 200,
			`{"channel":"room","subscriberCount":4,"presenceMemberCount":3}`)
		timed(n, "GET /channels/room/members", func() relaytest.Response { return hc.BearerGet("/channels/room/members", p.SecretKey) }).Expect(t, 200,
			`{"channel":"room","members":["u1","u2","u3"]}`)
		hc.BearerGet("/channels/nobody", p.SecretKey).Expect(t, 200, `{"channel":"nobody","subscriberCount":0,"presenceMemberCount":0}`)
		hc.BearerGet("/channels/nobody/members", p.SecretKey).Expect(t, 200, `{"channel":"nobody","members":[]}`)
		hc.BearerGet("/channels/nobody/messages?since=1", p.SecretKey).Expect(t, 200, `{"channel":"nobody","messages":[],"gap":false}`)
	}
	// A query never starts a grain (a tenant cannot make the cluster hold
	// grains by asking about channels nobody uses).
	for _, n := range cl.nodes {
		if n.hostsGrain(t, p.ID+"/nobody") {
			t.Fatalf("%s started a grain for a query", n.name)
		}
	}

	// History: the grain's ring, whichever node asks.
	e1 := expectEmitted(t, a.on(t).Client().Emit(p.SecretKey, `{"channel":"room","payload":{"n":1}}`), "room")
	e2 := expectEmitted(t, b.on(t).Client().Emit(p.SecretKey, `{"channel":"room","payload":{"n":2}}`), "room")
	if e1.subscriberCount != 4 {
		t.Fatalf("emit subscriberCount %d, want 4", e1.subscriberCount)
	}
	m1 := fmt.Sprintf(`{"channel":"room","payload":{"n":1},"seq":%d}`, e1.seq)
	m2 := fmt.Sprintf(`{"channel":"room","payload":{"n":2},"seq":%d}`, e2.seq)
	for _, n := range cl.nodes {
		hc := n.on(t).Client()
		timed(n, "GET /channels/room/messages", func() relaytest.Response {
			return hc.BearerGet(fmt.Sprintf("/channels/room/messages?since=%d", e1.seq-1), p.SecretKey)
		}).Expect(t, 200, `{"channel":"room","messages":[`+m1+`,`+m2+`],"gap":false}`)
		hc.BearerGet(fmt.Sprintf("/channels/room/messages?since=%d", e1.seq), p.SecretKey).Expect(t, 200,
			`{"channel":"room","messages":[`+m2+`],"gap":false}`)
	}

	// Batch through C: both channels, one result each.
	r := c.on(t).Client().BearerPost("/emit/batch", p.SecretKey, `{"messages":[{"channel":"room","payload":3},{"channel":"lobby","payload":4}]}`)
	res, _ := r.JSON["results"].([]any)
	if r.Status != 200 || len(res) != 2 || relaytest.Num(res[0].(map[string]any), "delivered") != 4 || relaytest.Num(res[1].(map[string]any), "delivered") != 2 {
		t.Fatalf("batch: %d %s", r.Status, r.Raw)
	}
	for _, u := range []*relaytest.WS{u1, u2, u3} {
		u.Expect(`{"channel":"room","payload":{"n":1},"seq":` + fmt.Sprint(e1.seq) + `}`)
		u.Expect(`{"channel":"room","payload":{"n":2},"seq":` + fmt.Sprint(e2.seq) + `}`)
		u.Expect(fmt.Sprintf(`{"channel":"room","payload":3,"seq":%d}`, e2.seq+1))
	}

	// Disconnect through C the clientId whose socket is on B.
	u2b := a.on(t).PresenceSub(t, p.PublicKey, "other", "u2") // and a second socket of u2, on A
	u2b.Expect(syncFrame("other"))
	hc := c.on(t).Client()
	timed(c, "POST /clients/u2/disconnect", func() relaytest.Response {
		return hc.Send("POST", "/clients/u2/disconnect", "", "", map[string]string{"Authorization": "Bearer " + p.SecretKey})
	}).Expect(t, 200, `{"ok":true,"closed":2}`)
	u2.ExpectClose(4003, 5*time.Second)
	u2b.ExpectClose(4003, 5*time.Second)
	u1.Expect(presenceFrame("room", "leave", "u2"))
	u3.Expect(presenceFrame("room", "leave", "u2"))
	for _, n := range cl.nodes {
		hc := n.on(t).Client()
		hc.BearerGet("/channels/room", p.SecretKey).Expect(t, 200, `{"channel":"room","subscriberCount":3,"presenceMemberCount":2}`)
		hc.BearerGet("/channels/room/members", p.SecretKey).Expect(t, 200, `{"channel":"room","members":["u1","u3"]}`)
	}
	hc.Send("POST", "/clients/u2/disconnect", "", "", map[string]string{"Authorization": "Bearer " + p.SecretKey}).
		Expect(t, 200, `{"ok":true,"closed":0}`)

	// Channel history through the nodes that never served the project: a
	// second project keeps history and emits through A alone; B and C hold
	// no actor of it and answer from the store (a page of the store says
	// "more"; the ring's answer does not).
	q := owner.CreateProject("history")
	if r := owner.Do("PATCH", "/api/projects/"+q.ID+"/settings", `{"historyRetentionSeconds":3600}`); r.Status != 200 {
		t.Fatalf("history on: %d %s", r.Status, r.Raw)
	}
	var stored []string
	for i := range 3 {
		r, err := emitAt(http.DefaultClient, a.proc.Base, q.SecretKey, "log", fmt.Sprintf(`{"n":%d}`, i))
		if err != nil {
			t.Fatal(err)
		}
		e := expectEmitted(t, r, "log")
		stored = append(stored, fmt.Sprintf(`{"channel":"log","payload":{"n":%d},"seq":%d}`, i, e.seq))
	}
	for _, n := range []*clusterNode{b, c} {
		hc := n.on(t).Client()
		timed(n, "GET /channels/log/messages (history)", func() relaytest.Response {
			return hc.BearerGet("/channels/log/messages?limit=2", q.SecretKey)
		}).Expect(t, 200, `{"channel":"log","messages":[`+stored[1]+`,`+stored[2]+`],"gap":false,"more":true}`)
		hc.BearerGet("/channels/log/messages?limit=5", q.SecretKey).Expect(t, 200,
			`{"channel":"log","messages":[`+strings.Join(stored, ",")+`],"gap":false,"more":false}`)
	}
}
