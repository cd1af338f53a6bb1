package main

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// runningProjects is projectsMatching of /debug/actors: project actors alive.
func runningProjects(t *testing.T, ts *testServer) int {
	t.Helper()
	status, body := getText(t, ts.debug+"/debug/actors")
	var v struct {
		Total int `json:"projectsMatching"`
	}
	if status != http.StatusOK || json.Unmarshal([]byte(body), &v) != nil {
		t.Fatalf("/debug/actors: %d %s", status, body)
	}
	return v.Total
}

// Project and channel actors with nothing left to keep stop after
// ACTOR_DORMANCY_SECONDS (counts rolled up, budgets run out); the project
// works as before when it is used again, with seq still rising.
func TestIdleProjectActorsStop(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, dbURL string) { idleProjectActorsStop(t, dbURL) })
}

func idleProjectActorsStop(t *testing.T, dbURL string) {
	clock := newClock()
	ts := startServerAt(t, dbURL, map[string]string{
		"RELAY_DEBUG_ADDR": "127.0.0.1:0", "ACTOR_DORMANCY_SECONDS": "1", "USAGE_ROLLUP_SECONDS": "1",
	}, clock.Now)
	owner := ts.signup("alice@example.com")
	p := owner.createProject("quiet")
	ws := subscribed(t, ts, p.publicKey, "room")
	first := owner.emit(p.secretKey, `{"channel":"room","payload":1}`)
	ws.expectExcept(`{"channel":"room","payload":1}`, "seq")
	if runningProjects(t, ts) != 1 {
		t.Fatal("no project actor while connected")
	}
	ws.conn.Close()
	clock.Advance(time.Minute) // the budget windows run out
	relaytest.Eventually(t, 20*time.Second, func() bool { return runningProjects(t, ts) == 0 },
		"idle project actor still running")

	again := owner.emit(p.secretKey, `{"channel":"room","payload":2}`)
	if again.status != http.StatusOK || num(again.json, "seq") <= num(first.json, "seq") {
		t.Fatalf("emit after the actor stopped: %d %s (first seq %v)", again.status, again.raw, first.json["seq"])
	}
	if runningProjects(t, ts) != 1 {
		t.Error("the project was used again but has no actor")
	}
}

// A deleted project's connections close with 4004 and its actor stops.
func TestDeletedProjectActorStops(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, dbURL string) { deletedProjectActorStops(t, dbURL) })
}

func deletedProjectActorStops(t *testing.T, dbURL string) {
	ts := startServer(t, dbURL, map[string]string{"RELAY_DEBUG_ADDR": "127.0.0.1:0"})
	owner := ts.signup("alice@example.com")
	p := owner.createProject("doomed")
	ws := subscribed(t, ts, p.publicKey, "room")
	if r := owner.do("DELETE", "/api/projects/"+p.id, ""); r.status != http.StatusOK {
		t.Fatalf("delete: %d %s", r.status, r.raw)
	}
	ws.expectClose(4004, 5*time.Second)
	relaytest.Eventually(t, 5*time.Second, func() bool { return runningProjects(t, ts) == 0 },
		"deleted project's actor still running")
}
