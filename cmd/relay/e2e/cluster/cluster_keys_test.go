//go:build cluster

package cluster

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
	// Not parallel: the close within 3 s of the overlap's end.
	cl := startCluster(t, 5*time.Second, []string{"A", "B"})
	a, b := cl.nodes[0], cl.nodes[1]
	tsA, tsB := a.on(t), b.on(t)
	owner := tsA.Signup("alice@example.com")
	p := owner.CreateProject("overlap")
	viaA, viaB := tsA.Client(), tsB.Client()
	emitOn := func(c *relaytest.Client, key string) relaytest.Response {
		return c.Emit(key, `{"channel":"x","payload":1}`)
	}
	if r := emitOn(viaB, p.SecretKey); r.Status != http.StatusOK { // cached on B
		t.Fatalf("emit on B: %d %s", r.Status, r.Raw)
	}
	onA, onB := tsA.Subscribed(t, p.PublicKey, "room"), tsB.Subscribed(t, p.PublicKey, "room")

	rs := owner.Do("POST", "/api/projects/"+p.ID+"/keys", `{"keyType":"secret","overlapSeconds":3}`)
	rp := owner.Do("POST", "/api/projects/"+p.ID+"/keys", `{"keyType":"public","overlapSeconds":3}`)
	if rs.Status != http.StatusCreated || rp.Status != http.StatusCreated {
		t.Fatalf("rotate: %d %s / %d %s", rs.Status, rs.Raw, rp.Status, rp.Raw)
	}
	end, err := time.Parse(time.RFC3339Nano, rp.Str("previousValidUntil"))
	if err != nil {
		t.Fatalf("previousValidUntil %q: %v", rp.Str("previousValidUntil"), err)
	}
	closeA, closeB := closeWatch(onA), closeWatch(onB)

	// In the window, on both nodes: old and new keys work.
	for _, c := range []*relaytest.Client{viaA, viaB} {
		for _, k := range []string{p.SecretKey, rs.Str("key", "raw")} {
			if r := emitOn(c, k); r.Status != http.StatusOK {
				if time.Now().Before(end) {
					t.Fatalf("emit in the window: %d %s", r.Status, r.Raw)
				}
			}
		}
	}
	if _, status, err := tsB.TryDialWS(p.PublicKey); err != nil && time.Now().Before(end) {
		t.Fatalf("old public key on B in the window: %d %v", status, err)
	}

	// After the end, on both nodes: refused as revoked; the sockets close.
	// Time by nature: the window must have ended (the closes, the only sign
	// of it, may come a tick later, and the emits must be refused at once).
	time.Sleep(time.Until(end) + 50*time.Millisecond)
	for _, c := range []*relaytest.Client{viaA, viaB} {
		emitOn(c, p.SecretKey).Expect(t, http.StatusUnauthorized, `{"error":"invalid_secret_key"}`)
		if r := emitOn(c, rs.Str("key", "raw")); r.Status != http.StatusOK {
			t.Fatalf("new secret key after the window: %d %s", r.Status, r.Raw)
		}
	}
	tsB.Handshake("/ws?publicKey="+url.QueryEscape(p.PublicKey)).Expect(t, http.StatusUnauthorized, `{"error":"unauthorized"}`)
	for name, ch := range map[string]<-chan closing{"A": closeA, "B": closeB} {
		at := closedAt(t, name, ch, 4001)
		t.Logf("close 4001 on %s: %+.1f ms from the end of the window", name, float64(at.Sub(end).Microseconds())/1000)
		if at.Before(end) || at.After(end.Add(3*time.Second)) {
			t.Errorf("%s closed at %v, the window ended at %v", name, at, end)
		}
	}
	tsB.Subscribed(t, rp.Str("key", "raw"), "room") // the new key connects
}

// TestClusterAdminRevoke: keys revoked with `relay admin` (no node's API,
// so no broadcast) are refused on both nodes of a cluster within 2 s, by
// nodes that had them cached, and the sockets opened with the public key on
// A and on B close with 4001, as after a dashboard revoke.
func TestClusterAdminRevoke(t *testing.T) {
	// Not parallel: a revoke applied within 2 s.
	cl := startCluster(t, 5*time.Second, []string{"A", "B"})
	tsA, tsB := cl.nodes[0].on(t), cl.nodes[1].on(t)
	owner := tsA.Signup("alice@example.com")
	p := owner.CreateProject("admin-revoke")
	nodes := []*relaytest.Server{tsA, tsB}
	for _, ts := range nodes { // cached on both
		if r := ts.Client().Emit(p.SecretKey, `{"channel":"x","payload":1}`); r.Status != http.StatusOK {
			t.Fatalf("emit: %d %s", r.Status, r.Raw)
		}
	}
	onA, onB := tsA.Subscribed(t, p.PublicKey, "room"), tsB.Subscribed(t, p.PublicKey, "room")
	keys := owner.Do("GET", "/api/projects/"+p.ID+"/keys", "")
	for _, k := range keys.JSON["keys"].([]any) {
		relaytest.CommandOK(t, []string{"DATABASE_URL=" + cl.dbURL}, "admin", "revoke-key", "--project", p.ID, "--key", k.(map[string]any)["id"].(string))
	}
	done := time.Now()
	for i, ws := range []*relaytest.WS{onA, onB} {
		if f := ws.ExpectClose(4001, time.Until(done.Add(2*time.Second))); f.Reason != "key revoked" {
			t.Fatalf("node %d: closed with 4001 %q, want \"key revoked\"", i, f.Reason)
		}
	}
	for i, ts := range nodes {
		var last relaytest.Response
		relaytest.EventuallyNil(t, time.Until(done.Add(2*time.Second)), func() error {
			if last = ts.Client().EmitNoFail(p.SecretKey, `{"channel":"x","payload":1}`); last.Status != http.StatusUnauthorized {
				return fmt.Errorf("node %d: the revoked secret key still answered %d %s 2 s after relay admin", i, last.Status, last.Raw)
			}
			return nil
		})
		last.Expect(t, http.StatusUnauthorized, `{"error":"invalid_secret_key"}`)
		ts.Handshake("/ws?publicKey="+p.PublicKey).Expect(t, http.StatusUnauthorized, `{"error":"unauthorized"}`)
	}
}
