//go:build cluster

package main

// Keys rotated with an overlap window across nodes (README.md › Keys):
// `make test-cluster`, like cluster_test.go.

import (
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
)

// TestClusterKeyOverlap: two nodes (real binaries, PostgreSQL, etcd). Keys
// rotated through A with a 3 s window keep working on B, whose cache held
// them before (the rotation's change made it drop and load them again, with
// their end); at the end B refuses them with no message from A, and the
// sockets opened with the old public key on A and on B close with 4001.
func TestClusterKeyOverlap(t *testing.T) {
	cl := startCluster(t, 5*time.Second, []string{"A", "B"})
	a, b := cl.nodes[0], cl.nodes[1]
	tsA, tsB := a.on(t), b.on(t)
	owner := tsA.signup("alice@example.com")
	p := owner.createProject("overlap")
	viaA, viaB := tsA.client(), tsB.client()
	emitOn := func(c *client, key string) response { return c.emit(key, `{"channel":"x","payload":1}`) }
	if r := emitOn(viaB, p.secretKey); r.status != http.StatusOK { // cached on B
		t.Fatalf("emit on B: %d %s", r.status, r.raw)
	}
	onA, onB := subscribed(t, tsA, p.publicKey, "room"), subscribed(t, tsB, p.publicKey, "room")

	rs := owner.do("POST", "/api/projects/"+p.id+"/keys", `{"keyType":"secret","overlapSeconds":3}`)
	rp := owner.do("POST", "/api/projects/"+p.id+"/keys", `{"keyType":"public","overlapSeconds":3}`)
	if rs.status != http.StatusCreated || rp.status != http.StatusCreated {
		t.Fatalf("rotate: %d %s / %d %s", rs.status, rs.raw, rp.status, rp.raw)
	}
	end, err := time.Parse(time.RFC3339Nano, rp.str("previousValidUntil"))
	if err != nil {
		t.Fatalf("previousValidUntil %q: %v", rp.str("previousValidUntil"), err)
	}
	closeA, closeB := closeWatch(onA), closeWatch(onB)

	// In the window, on both nodes: old and new keys work.
	for _, c := range []*client{viaA, viaB} {
		for _, k := range []string{p.secretKey, rs.str("key", "raw")} {
			if r := emitOn(c, k); r.status != http.StatusOK {
				if time.Now().Before(end) {
					t.Fatalf("emit in the window: %d %s", r.status, r.raw)
				}
			}
		}
	}
	if _, status, err := tsB.tryDialWS(p.publicKey); err != nil && time.Now().Before(end) {
		t.Fatalf("old public key on B in the window: %d %v", status, err)
	}

	// After the end, on both nodes: refused as revoked; the sockets close.
	// Time by nature: the window must have ended (the closes, the only sign
	// of it, may come a tick later, and the emits must be refused at once).
	time.Sleep(time.Until(end) + 50*time.Millisecond)
	for _, c := range []*client{viaA, viaB} {
		emitOn(c, p.secretKey).expect(t, http.StatusUnauthorized, `{"error":"invalid_secret_key"}`)
		if r := emitOn(c, rs.str("key", "raw")); r.status != http.StatusOK {
			t.Fatalf("new secret key after the window: %d %s", r.status, r.raw)
		}
	}
	tsB.handshake("/ws?publicKey="+url.QueryEscape(p.publicKey)).expect(t, http.StatusUnauthorized, `{"error":"unauthorized"}`)
	for name, ch := range map[string]<-chan closing{"A": closeA, "B": closeB} {
		at := closedAt(t, name, ch, 4001)
		t.Logf("close 4001 on %s: %+.1f ms from the end of the window", name, float64(at.Sub(end).Microseconds())/1000)
		if at.Before(end) || at.After(end.Add(3*time.Second)) {
			t.Errorf("%s closed at %v, the window ended at %v", name, at, end)
		}
	}
	subscribed(t, tsB, rp.str("key", "raw"), "room") // the new key connects
}

// TestClusterAdminRevoke: keys revoked with `relay admin` (no node's API,
// so no broadcast) are refused on both nodes of a cluster within 2 s, by
// nodes that had them cached, and the sockets opened with the public key on
// A and on B close with 4001, as after a dashboard revoke.
func TestClusterAdminRevoke(t *testing.T) {
	cl := startCluster(t, 5*time.Second, []string{"A", "B"})
	tsA, tsB := cl.nodes[0].on(t), cl.nodes[1].on(t)
	owner := tsA.signup("alice@example.com")
	p := owner.createProject("admin-revoke")
	nodes := []*testServer{tsA, tsB}
	for _, ts := range nodes { // cached on both
		if r := ts.client().emit(p.secretKey, `{"channel":"x","payload":1}`); r.status != http.StatusOK {
			t.Fatalf("emit: %d %s", r.status, r.raw)
		}
	}
	onA, onB := subscribed(t, tsA, p.publicKey, "room"), subscribed(t, tsB, p.publicKey, "room")
	keys := owner.do("GET", "/api/projects/"+p.id+"/keys", "")
	for _, k := range keys.json["keys"].([]any) {
		adminOK(t, cl.dbURL, "revoke-key", "--project", p.id, "--key", k.(map[string]any)["id"].(string))
	}
	done := time.Now()
	for i, ws := range []*wsClient{onA, onB} {
		if f := ws.expectClose(4001, time.Until(done.Add(2*time.Second))); f.reason != "key revoked" {
			t.Fatalf("node %d: closed with 4001 %q, want \"key revoked\"", i, f.reason)
		}
	}
	for i, ts := range nodes {
		var last response
		relaytest.EventuallyNil(t, time.Until(done.Add(2*time.Second)), func() error {
			if last = ts.client().emitNoFail(p.secretKey, `{"channel":"x","payload":1}`); last.status != http.StatusUnauthorized {
				return fmt.Errorf("node %d: the revoked secret key still answered %d %s 2 s after relay admin", i, last.status, last.raw)
			}
			return nil
		})
		last.expect(t, http.StatusUnauthorized, `{"error":"invalid_secret_key"}`)
		ts.handshake("/ws?publicKey="+p.publicKey).expect(t, http.StatusUnauthorized, `{"error":"unauthorized"}`)
	}
}
