package main

// A project's delete, seen in its database: the one control-plane test that
// reads what HTTP cannot show, so it runs in process beside the store.

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/relayhq/relay/api"
	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
)

// TestProjectDeleteCascades: DELETE answers {ok:true}; the project, its keys
// and its usage rows are gone; other projects stay.
func TestProjectDeleteCascades(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := startServer(t, dbURL, nil)
		alice, aliceID := ts.SignupID(t, "alice@example.com")
		p, _ := relaytest.CreateChecked(alice, t, "Doomed", aliceID)
		keep, kb := relaytest.CreateChecked(alice, t, "Kept", aliceID)
		rot := alice.Do("POST", "/api/projects/"+p.ID+"/keys", `{"keyType":"public"}`)
		if rot.Status != http.StatusCreated {
			t.Fatalf("rotate: %d %s", rot.Status, rot.Raw)
		}
		keys, _ := relaytest.Keys(alice, t, p.ID)
		_, keepKeys := relaytest.Keys(alice, t, keep.ID)

		// A second handle on the same database sees what HTTP cannot.
		ctx := context.Background()
		st, err := store.Open(ctx, dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		day := time.Now().UTC().Format("2006-01-02")
		for _, id := range []string{p.ID, keep.ID} {
			if err := st.AddUsage(ctx, store.Usage{ProjectID: id, Day: day, ConnectionCount: 3, MessageCount: 7}); err != nil {
				t.Fatal(err)
			}
		}
		raws := []string{p.PublicKey, p.SecretKey, rot.Str("key", "raw")}
		for _, raw := range raws {
			if _, err := st.KeyByHash(ctx, api.HashKey(raw)); err != nil {
				t.Fatalf("key %s not stored before delete: %v", raw[:12], err)
			}
		}

		alice.Do("DELETE", "/api/projects/"+p.ID, "").Expect(t, http.StatusOK, `{"ok":true}`)

		const gone = `{"error":"project_not_found"}`
		for _, rt := range relaytest.ProjectRoutes(p.ID, keys[0]["id"].(string)) {
			r := alice.Do(rt.Method, rt.Path, rt.Body)
			if r.Status != http.StatusNotFound {
				t.Fatalf("%s on deleted project: %d %s", rt.Name, r.Status, r.Raw)
			}
			r.Expect(t, http.StatusNotFound, gone)
		}
		alice.Do("GET", "/api/projects", "").Expect(t, http.StatusOK, relaytest.JSON(map[string]any{"projects": []any{kb}}))

		// Cascade: keys (active and revoked) and usage rows are gone.
		if ks, err := st.Keys(ctx, p.ID); err != nil || len(ks) != 0 {
			t.Fatalf("keys of the deleted project: %d left (err %v)", len(ks), err)
		}
		for _, raw := range raws {
			if _, err := st.KeyByHash(ctx, api.HashKey(raw)); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("key %s… of the deleted project still stored (err %v)", raw[:12], err)
			}
		}
		if us, err := st.Usage(ctx, p.ID, "0000-00-00"); err != nil || len(us) != 0 {
			t.Fatalf("usage rows of the deleted project: %d left (err %v)", len(us), err)
		}

		// The other project is whole.
		alice.Do("GET", "/api/projects/"+keep.ID, "").Expect(t, http.StatusOK, relaytest.JSON(map[string]any{"project": kb}))
		if _, after := relaytest.Keys(alice, t, keep.ID); after != keepKeys {
			t.Fatalf("deleting one project changed another's keys")
		}
		for _, raw := range []string{keep.PublicKey, keep.SecretKey} {
			if _, err := st.KeyByHash(ctx, api.HashKey(raw)); err != nil {
				t.Fatalf("key of the kept project lost: %v", err)
			}
		}
		if us, err := st.Usage(ctx, keep.ID, "0000-00-00"); err != nil || len(us) != 1 {
			t.Fatalf("usage rows of the kept project: %d (err %v), want 1", len(us), err)
		}
	})
}
