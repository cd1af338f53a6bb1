package relaytest

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// HookLog is a webhook endpoint that keeps every request's exact body and
// signature header, for tests that compare bodies byte for byte.
type HookLog struct {
	URL    string // where it listens, on loopback
	mu     sync.Mutex
	bodies []hookRequest
}

type hookRequest struct{ body, signature string }

// NewHookLog starts a HookLog, closed when t ends.
func NewHookLog(t testing.TB) *HookLog {
	h := &HookLog{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		h.bodies = append(h.bodies, hookRequest{string(body), r.Header.Get("X-Service-Signature")})
		h.mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	h.URL = srv.URL
	return h
}

var (
	hookTimestamp = regexp.MustCompile(`"timestamp":"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)"`)
	hookID        = regexp.MustCompile(`^\{"id":"([A-Za-z0-9_-]{22})",`) // 16 random bytes, base64url, first
)

// ChannelEvents takes the requests received so far that are not connect or
// disconnect, checks each signature against secret, each id (first, unique)
// and each timestamp (UTC, milliseconds, within the last minute), and
// returns the bodies with the id replaced by "I" and the timestamp by "T",
// in the order they arrived.
func (h *HookLog) ChannelEvents(t testing.TB, secret string) []string {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	ids := map[string]bool{}
	for _, r := range h.bodies {
		mac := hmac.New(sha256.New, []byte(secret))
		mac.Write([]byte(r.body))
		if want := "sha256=" + hex.EncodeToString(mac.Sum(nil)); r.signature != want {
			t.Fatalf("signature %q on %s, want %q", r.signature, r.body, want)
		}
		var ev struct{ Event string }
		if err := json.Unmarshal([]byte(r.body), &ev); err != nil {
			t.Fatalf("not JSON: %s", r.body)
		}
		if ev.Event == "connect" || ev.Event == "disconnect" {
			continue
		}
		m := hookTimestamp.FindStringSubmatch(r.body)
		if m == nil {
			t.Fatalf("no timestamp in %s", r.body)
		}
		if at, err := time.Parse(time.RFC3339Nano, m[1]); err != nil || time.Since(at) > time.Minute || time.Until(at) > time.Second {
			t.Fatalf("timestamp %s: %v", m[1], err)
		}
		id := hookID.FindStringSubmatch(r.body)
		if id == nil || ids[id[1]] {
			t.Fatalf("no id, or a repeated one, in %s", r.body)
		}
		ids[id[1]] = true
		body := hookID.ReplaceAllString(r.body, `{"id":"I",`)
		out = append(out, hookTimestamp.ReplaceAllString(body, `"timestamp":"T"`))
	}
	return out
}

// ExpectEvents waits until the channel and presence events received since
// the last call are exactly want (in any order: a project has two
// deliveries under way at once, so they may overtake each other).
func (h *HookLog) ExpectEvents(t testing.TB, secret string, seen *int, want ...string) {
	t.Helper()
	h.ExpectEventsQuiet(t, secret, seen, 100*time.Millisecond, want...)
}

// ExpectEventsQuiet is ExpectEvents with nothing more for quiet once they
// have come.
func (h *HookLog) ExpectEventsQuiet(t testing.TB, secret string, seen *int, quiet time.Duration, want ...string) {
	t.Helper()
	var got []string
	Within(5*time.Second, func() bool {
		got = h.ChannelEvents(t, secret)[*seen:]
		return len(got) >= len(want)
	})
	// Time by nature: and nothing more within quiet (polled, so that one
	// more ends the wait at once).
	Within(quiet, func() bool { return len(h.ChannelEvents(t, secret)) > *seen+len(want) })
	got = h.ChannelEvents(t, secret)[*seen:]
	a, b := slices.Clone(got), slices.Clone(want)
	slices.Sort(a)
	slices.Sort(b)
	if !slices.Equal(a, b) {
		t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	*seen += len(got)
}

// ChannelHook is a channel event's body as ChannelEvents returns it.
func ChannelHook(kind, projectID, channel string) string {
	return fmt.Sprintf(`{"id":"I","event":%q,"projectId":%q,"channel":%q,"timestamp":"T"}`, kind, projectID, channel)
}

// MemberHook is a presence event's body as ChannelEvents returns it.
func MemberHook(kind, projectID, channel, clientID string) string {
	return fmt.Sprintf(`{"id":"I","event":%q,"projectId":%q,"channel":%q,"clientId":%q,"timestamp":"T"}`, kind, projectID, channel, clientID)
}

// Bodies is every request's body received so far, in order.
func (h *HookLog) Bodies() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]string, len(h.bodies))
	for i, r := range h.bodies {
		out[i] = r.body
	}
	return out
}
