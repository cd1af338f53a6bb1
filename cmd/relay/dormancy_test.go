package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// liveActors is what /debug/actors counts: project actors alive, and the
// channel actors of all of them.
func liveActors(t *testing.T, ts *testServer) (projects, channels int) {
	t.Helper()
	status, body := relaytest.GetText(t, ts.Debug+"/debug/actors?limit=500")
	var v struct {
		Total    int `json:"projectsMatching"`
		Projects []struct {
			Channels int `json:"channels"`
		} `json:"projects"`
	}
	if status != http.StatusOK || json.Unmarshal([]byte(body), &v) != nil || len(v.Projects) != v.Total {
		t.Fatalf("/debug/actors: %d %s", status, body)
	}
	for _, p := range v.Projects {
		channels += p.Channels
	}
	return v.Total, channels
}

// expectActors fails unless /debug/actors shows projects and channels within
// timeout (0: now).
func expectActors(t *testing.T, ts *testServer, timeout time.Duration, projects, channels int, what string) {
	t.Helper()
	relaytest.EventuallyNil(t, timeout, func() error {
		if p, c := liveActors(t, ts); p != projects || c != channels {
			return fmt.Errorf("%s: %d project and %d channel actors, want %d and %d", what, p, c, projects, channels)
		}
		return nil
	})
}

// Project and channel actors with nothing left to keep stop after
// ACTOR_DORMANCY_SECONDS (counts rolled up, budgets and replay run out): a
// channel nobody listens to stops while its project lives on, the project
// once its last channel and connection are gone; each works as before when
// used again, with seq still rising.
func TestIdleProjectActorsStop(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) { idleProjectActorsStop(t, dbURL) })
}

func idleProjectActorsStop(t *testing.T, dbURL string) {
	clock := newClock()
	ts := startServerAt(t, dbURL, map[string]string{
		"RELAY_DEBUG_ADDR": "127.0.0.1:0", "ACTOR_DORMANCY_SECONDS": "1", "USAGE_ROLLUP_SECONDS": "1",
	}, clock.Now)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("quiet")
	emit := func(payload int, after float64) float64 {
		t.Helper()
		r := owner.Emit(p.SecretKey, fmt.Sprintf(`{"channel":"room","payload":%d}`, payload))
		if r.Status != http.StatusOK || relaytest.Num(r.JSON, "seq") <= after {
			t.Fatalf("emit %d: %d %s (the seq before: %v)", payload, r.Status, r.Raw, after)
		}
		return relaytest.Num(r.JSON, "seq")
	}
	ws := ts.Subscribed(t, p.PublicKey, "room")
	lobby := ts.Subscribed(t, p.PublicKey, "lobby")
	seq := emit(1, 0)
	ws.ExpectExcept(`{"channel":"room","payload":1}`, "seq")
	expectActors(t, ts, 0, 1, 2, "both channels in use")

	ws.Conn.Close()
	clock.Advance(time.Minute) // room's budget window and replay ring run out
	expectActors(t, ts, 20*time.Second, 1, 1, "room idle, lobby still subscribed")
	seq = emit(2, seq) // room's channel actor starts again inside the live project
	expectActors(t, ts, 0, 1, 2, "room used again")

	lobby.Conn.Close()
	clock.Advance(time.Minute)
	expectActors(t, ts, 20*time.Second, 0, 0, "the whole project idle")
	emit(3, seq)
	expectActors(t, ts, 0, 1, 1, "the project used again")
}

// A cold project (its actor stopped as dormant) whose settings cannot be
// loaded answers emits service_unavailable, over HTTP and on the socket
// (PROTOCOL.md), and delivers none of them later; once the store is back the
// load is retried and emits work again. The keys were used before, so the
// edge knows them without the store.
func TestColdProjectWithoutSettingsRefusesEmits(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	clock := newClock()
	ts := startServerAt(t, "sqlite:"+filepath.Join(dir, "relay.db"), map[string]string{
		"RELAY_DEBUG_ADDR": "127.0.0.1:0", "ACTOR_DORMANCY_SECONDS": "1", "USAGE_ROLLUP_SECONDS": "1",
	}, clock.Now)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("cold")
	ts.Subscribed(t, p.PublicKey, "room").Conn.Close()
	if r := owner.Emit(p.SecretKey, `{"channel":"room","payload":0}`); r.Status != http.StatusOK {
		t.Fatalf("first emit: %d %s", r.Status, r.Raw)
	}
	clock.Advance(time.Minute)
	expectActors(t, ts, 20*time.Second, 0, 0, "the project gone cold")

	// The store goes away (TestSQLiteDirectoryGone): nothing can be loaded.
	if err := os.Rename(dir, dir+".moved"); err != nil {
		t.Fatal(err)
	}
	sub := ts.Subscribed(t, p.PublicKey, "room")
	owner.Emit(p.SecretKey, `{"channel":"room","payload":1}`).Expect(t, http.StatusServiceUnavailable, `{"error":"service_unavailable"}`)
	sub.Send(`{"action":"emit","channel":"room","type":"t","token":"x","payload":2}`)
	sub.Expect(`{"error":"service_unavailable","channel":"room"}`)
	owner.Emit(p.SecretKey, `{"channel":"room","payload":3}`).Expect(t, http.StatusServiceUnavailable, `{"error":"service_unavailable"}`)

	if err := os.Rename(dir+".moved", dir); err != nil {
		t.Fatal(err)
	}
	relaytest.Eventually(t, 10*time.Second, func() bool {
		return owner.Emit(p.SecretKey, `{"channel":"room","payload":4}`).Status == http.StatusOK
	}, "emits accepted once the settings load")
	sub.ExpectExcept(`{"channel":"room","payload":4}`, "seq") // not 1, 2 or 3
	sub.ExpectSilence(100 * time.Millisecond)
}

// A deleted project's connections close with 4004 and its actor stops.
func TestDeletedProjectActorStops(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) { deletedProjectActorStops(t, dbURL) })
}

func deletedProjectActorStops(t *testing.T, dbURL string) {
	ts := startServer(t, dbURL, map[string]string{"RELAY_DEBUG_ADDR": "127.0.0.1:0"})
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("doomed")
	ws := ts.Subscribed(t, p.PublicKey, "room")
	if r := owner.Do("DELETE", "/api/projects/"+p.ID, ""); r.Status != http.StatusOK {
		t.Fatalf("delete: %d %s", r.Status, r.Raw)
	}
	ws.ExpectClose(4004, 5*time.Second)
	expectActors(t, ts, 5*time.Second, 0, 0, "the deleted project")
}
