package store_test

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/relayhq/relay/store"
	"github.com/relayhq/relay/store/storetest"
)

// TestUsersAndProjectsListed: Users and Projects list every row, whoever
// owns it, oldest first; an empty store lists none.
func TestUsersAndProjectsListed(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		s := open(t, url)
		if us, err := s.Users(ctx); err != nil || len(us) != 0 {
			t.Fatalf("users of an empty store: %v, %v", us, err)
		}
		if ps, err := s.Projects(ctx); err != nil || len(ps) != 0 {
			t.Fatalf("projects of an empty store: %v, %v", ps, err)
		}
		a, _ := s.CreateUser(ctx, "a@example.com", "h")
		b, _ := s.CreateUser(ctx, "b@example.com", "h")
		p1, _, _ := newProject(t, s, b.ID)
		p2, _, _ := newProject(t, s, a.ID)
		us, err := s.Users(ctx)
		if err != nil || len(us) != 2 || us[0].ID != a.ID || us[1].ID != b.ID || us[1].Email != "b@example.com" ||
			us[0].CreatedAt.Location().String() != "UTC" {
			t.Fatalf("users: %+v, %v", us, err)
		}
		ps, err := s.Projects(ctx)
		if err != nil || len(ps) != 2 {
			t.Fatalf("projects: %+v, %v", ps, err)
		}
		for i, want := range []store.Project{p1, p2} {
			got, _ := s.Project(ctx, want.ID)
			if !reflect.DeepEqual(ps[i], got) {
				t.Fatalf("project %d listed as %+v, stored %+v", i, ps[i], got)
			}
		}
	})
}

// TestUpdateSettingsRecordsKeyChange: a settings change is recorded as a
// key change of its project (no key revoked), so that nodes learning of
// changes only from the store reload the settings; a refused change records
// nothing.
func TestUpdateSettingsRecordsKeyChange(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ctx := context.Background()
		s := open(t, url)
		u, _ := s.CreateUser(ctx, "a@example.com", "h")
		p, _, _ := newProject(t, s, u.ID)
		last, err := s.LastKeyChange(ctx)
		if err != nil {
			t.Fatal(err)
		}
		limit := 5
		if err := s.UpdateSettings(ctx, p.ID, func(st *store.Settings) error { st.ChannelRateLimit = &limit; return nil }); err != nil {
			t.Fatal(err)
		}
		cs, err := s.KeyChangesAfter(ctx, last, 10)
		if err != nil || len(cs) != 1 || cs[0].ProjectID != p.ID || len(cs[0].Revoked) != 0 || cs[0].Seq != last+1 ||
			cs[0].KeysStale || !cs[0].SettingsStale { // the cached keys stay: only the settings reload
			t.Fatalf("key changes after a settings change: %+v, %v", cs, err)
		}
		no := errors.New("refused")
		if err := s.UpdateSettings(ctx, p.ID, func(st *store.Settings) error { st.ChannelRateLimit = nil; return no }); !errors.Is(err, no) {
			t.Fatalf("refused change: %v", err)
		}
		if n, err := s.LastKeyChange(ctx); err != nil || n != last+1 {
			t.Fatalf("a refused change recorded a key change: %d, %v", n, err)
		}
		if st, _ := s.Settings(ctx, p.ID); st.ChannelRateLimit == nil || *st.ChannelRateLimit != 5 {
			t.Fatalf("settings: %+v", st)
		}
	})
}
