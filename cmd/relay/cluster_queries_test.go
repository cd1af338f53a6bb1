//go:build cluster

package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestClusterQueries: occupancy, counts, members, messages (the ring, and
// the store for a history project) and disconnect through each of three
// nodes agree on the whole cluster.
func TestClusterQueries(t *testing.T) {
	cl := startCluster(t, 10*time.Second, []string{"A", "B", "C"})
	a, b, c := cl.nodes[0], cl.nodes[1], cl.nodes[2]
	owner := a.on(t).signup("alice@example.com")
	p := owner.createProject("queries")

	u1, u2, u3 := presenceTrio(t, p.publicKey, "room", a.on(t), b.on(t), c.on(t))
	subscribed(t, b.on(t), p.publicKey, "room")
	subscribed(t, c.on(t), p.publicKey, "lobby")
	subscribed(t, c.on(t), p.publicKey, "lobby")

	timed := func(n *clusterNode, what string, f func() response) response {
		t.Helper()
		t0 := time.Now()
		r := f()
		t.Logf("%s through %s answered in %v", what, n.name, time.Since(t0).Round(time.Microsecond))
		return r
	}
	for _, n := range cl.nodes {
		hc := n.on(t).client()
		timed(n, "GET /channels", func() response { return hc.bearerGet("/channels", p.secretKey) }).expect(t, 200,
			`{"channels":[{"channel":"lobby","subscriberCount":2},{"channel":"room","subscriberCount":4}],"nextCursor":null}`)
		hc.bearerGet("/channels?limit=1", p.secretKey).expect(t, 200,
			`{"channels":[{"channel":"lobby","subscriberCount":2}],"nextCursor":"lobby"}`)
		timed(n, "GET /channels/room", func() response { return hc.bearerGet("/channels/room", p.secretKey) }).expect(t, 200,
			`{"channel":"room","subscriberCount":4,"presenceMemberCount":3}`)
		timed(n, "GET /channels/room/members", func() response { return hc.bearerGet("/channels/room/members", p.secretKey) }).expect(t, 200,
			`{"channel":"room","members":["u1","u2","u3"]}`)
		hc.bearerGet("/channels/nobody", p.secretKey).expect(t, 200, `{"channel":"nobody","subscriberCount":0,"presenceMemberCount":0}`)
		hc.bearerGet("/channels/nobody/members", p.secretKey).expect(t, 200, `{"channel":"nobody","members":[]}`)
		hc.bearerGet("/channels/nobody/messages?since=1", p.secretKey).expect(t, 200, `{"channel":"nobody","messages":[],"gap":false}`)
	}
	// A query never starts a grain (a tenant cannot make the cluster hold
	// grains by asking about channels nobody uses).
	for _, n := range cl.nodes {
		if n.hostsGrain(t, p.id+"/nobody") {
			t.Fatalf("%s started a grain for a query", n.name)
		}
	}

	// History: the grain's ring, whichever node asks.
	e1 := expectEmitted(t, a.on(t).client().emit(p.secretKey, `{"channel":"room","payload":{"n":1}}`), "room")
	e2 := expectEmitted(t, b.on(t).client().emit(p.secretKey, `{"channel":"room","payload":{"n":2}}`), "room")
	if e1.subscriberCount != 4 {
		t.Fatalf("emit subscriberCount %d, want 4", e1.subscriberCount)
	}
	m1 := fmt.Sprintf(`{"channel":"room","payload":{"n":1},"seq":%d}`, e1.seq)
	m2 := fmt.Sprintf(`{"channel":"room","payload":{"n":2},"seq":%d}`, e2.seq)
	for _, n := range cl.nodes {
		hc := n.on(t).client()
		timed(n, "GET /channels/room/messages", func() response {
			return hc.bearerGet(fmt.Sprintf("/channels/room/messages?since=%d", e1.seq-1), p.secretKey)
		}).expect(t, 200, `{"channel":"room","messages":[`+m1+`,`+m2+`],"gap":false}`)
		hc.bearerGet(fmt.Sprintf("/channels/room/messages?since=%d", e1.seq), p.secretKey).expect(t, 200,
			`{"channel":"room","messages":[`+m2+`],"gap":false}`)
	}

	// Batch through C: both channels, one result each.
	r := c.on(t).client().bearerPost("/emit/batch", p.secretKey, `{"messages":[{"channel":"room","payload":3},{"channel":"lobby","payload":4}]}`)
	res, _ := r.json["results"].([]any)
	if r.status != 200 || len(res) != 2 || num(res[0].(map[string]any), "delivered") != 4 || num(res[1].(map[string]any), "delivered") != 2 {
		t.Fatalf("batch: %d %s", r.status, r.raw)
	}
	for _, u := range []*wsClient{u1, u2, u3} {
		u.expect(`{"channel":"room","payload":{"n":1},"seq":` + fmt.Sprint(e1.seq) + `}`)
		u.expect(`{"channel":"room","payload":{"n":2},"seq":` + fmt.Sprint(e2.seq) + `}`)
		u.expect(fmt.Sprintf(`{"channel":"room","payload":3,"seq":%d}`, e2.seq+1))
	}

	// Disconnect through C the clientId whose socket is on B.
	u2b := presenceSub(t, a.on(t), p.publicKey, "other", "u2") // and a second socket of u2, on A
	u2b.expect(syncFrame("other"))
	hc := c.on(t).client()
	timed(c, "POST /clients/u2/disconnect", func() response {
		return hc.send("POST", "/clients/u2/disconnect", "", "", map[string]string{"Authorization": "Bearer " + p.secretKey})
	}).expect(t, 200, `{"ok":true,"closed":2}`)
	u2.expectClose(4003, 5*time.Second)
	u2b.expectClose(4003, 5*time.Second)
	u1.expect(presenceFrame("room", "leave", "u2"))
	u3.expect(presenceFrame("room", "leave", "u2"))
	for _, n := range cl.nodes {
		hc := n.on(t).client()
		hc.bearerGet("/channels/room", p.secretKey).expect(t, 200, `{"channel":"room","subscriberCount":3,"presenceMemberCount":2}`)
		hc.bearerGet("/channels/room/members", p.secretKey).expect(t, 200, `{"channel":"room","members":["u1","u3"]}`)
	}
	hc.send("POST", "/clients/u2/disconnect", "", "", map[string]string{"Authorization": "Bearer " + p.secretKey}).
		expect(t, 200, `{"ok":true,"closed":0}`)

	// Channel history through the nodes that never served the project: a
	// second project keeps history and emits through A alone; B and C hold
	// no actor of it and answer from the store (a page of the store says
	// "more"; the ring's answer does not).
	q := owner.createProject("history")
	if r := owner.do("PATCH", "/api/projects/"+q.id+"/settings", `{"historyRetentionSeconds":3600}`); r.status != 200 {
		t.Fatalf("history on: %d %s", r.status, r.raw)
	}
	var stored []string
	for i := range 3 {
		r, err := emitAt(http.DefaultClient, a.proc.Base, q.secretKey, "log", fmt.Sprintf(`{"n":%d}`, i))
		if err != nil {
			t.Fatal(err)
		}
		e := expectEmitted(t, r, "log")
		stored = append(stored, fmt.Sprintf(`{"channel":"log","payload":{"n":%d},"seq":%d}`, i, e.seq))
	}
	for _, n := range []*clusterNode{b, c} {
		hc := n.on(t).client()
		timed(n, "GET /channels/log/messages (history)", func() response {
			return hc.bearerGet("/channels/log/messages?limit=2", q.secretKey)
		}).expect(t, 200, `{"channel":"log","messages":[`+stored[1]+`,`+stored[2]+`],"gap":false,"more":true}`)
		hc.bearerGet("/channels/log/messages?limit=5", q.secretKey).expect(t, 200,
			`{"channel":"log","messages":[`+strings.Join(stored, ",")+`],"gap":false,"more":false}`)
	}
}
