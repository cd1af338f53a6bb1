package api

import (
	"strconv"
	"testing"
	"time"
)

// TestSessionCacheKeepsLargerAndStaysBounded: a read that raced a logout on
// this node (it read "not ended" or the old epoch) cannot replace what the
// logout cached, and each map stays under maxSessionCache, keeping the
// answers that matter (ended sessions, raised epochs) longest.
func TestSessionCacheKeepsLargerAndStaysBounded(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	st := newSessionState(nil, func() time.Time { return now })
	st.put(st.revoked, "sid", 1)
	if v := st.put(st.revoked, "sid", 0); v != 1 {
		t.Fatalf("a late 'not ended' replaced 'ended': %d", v)
	}
	st.put(st.epochs, "user", 3)
	if v := st.put(st.epochs, "user", 2); v != 3 {
		t.Fatalf("an older epoch replaced the newer: %d", v)
	}

	for i := range maxSessionCache + 10 {
		st.put(st.revoked, "live-"+strconv.Itoa(i), 0)
		if len(st.revoked) > maxSessionCache {
			t.Fatalf("%d entries after %d puts", len(st.revoked), i+1)
		}
	}
	if c, ok := st.revoked["sid"]; !ok || c.v != 1 {
		t.Fatal("the ended session was evicted before entries holding the default answer")
	}
}
