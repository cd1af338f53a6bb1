package webhook

import (
	"context"
	"crypto/hmac"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// scripted is a receiver that answers each request with the next status of
// its script (the last one repeats) and hands over each request's body,
// id header and whether its signature verified.
type scripted struct {
	*httptest.Server
	mu       sync.Mutex
	statuses []int
	got      chan attempt
}

type attempt struct {
	body, idHeader string
	signed         bool
	ev             Event
}

func newScripted(t *testing.T, secret string, statuses ...int) *scripted {
	t.Helper()
	s := &scripted{statuses: statuses, got: make(chan attempt, 1000)}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		a := attempt{body: string(body), idHeader: req.Header.Get("X-Relay-Event-Id"),
			signed: hmac.Equal([]byte(req.Header.Get("X-Service-Signature")), []byte(Sign(secret, body)))}
		json.Unmarshal(body, &a.ev)
		s.mu.Lock()
		status := s.statuses[0]
		if len(s.statuses) > 1 {
			s.statuses = s.statuses[1:]
		}
		s.mu.Unlock()
		s.got <- a
		w.WriteHeader(status)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *scripted) next(t *testing.T) attempt {
	t.Helper()
	select {
	case a := <-s.got:
		return a
	case <-time.After(5 * time.Second):
		t.Fatal("no request within 5 s")
	}
	return attempt{}
}

// fast retries for tests: 20 ms, 40 ms, … at most 100 ms apart.
func fastRetries(cfg Config) Config {
	cfg.AllowPrivate, cfg.RetryBase, cfg.RetryMaxDelay = true, 20*time.Millisecond, 100*time.Millisecond
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Second
	}
	return cfg
}

func waitRecord(t *testing.T, d *Dispatcher, project, id string, ok func(Record) bool) Record {
	t.Helper()
	find := func() Record {
		for _, r := range d.Deliveries(project) {
			if r.ID == id {
				return r
			}
		}
		return Record{}
	}
	return waitUntil(t, "record "+id, find, func(r Record) bool { return r.ID == id && ok(r) })
}

// TestRetryAfter500ThenSuccess: the same event (same id, same signed
// bytes) comes again after a 500; the record says delivered in 2 attempts
// and keeps the first attempt's error.
func TestRetryAfter500ThenSuccess(t *testing.T) {
	r := newScripted(t, "s", 500, 204)
	d := New(fastRetries(Config{}))
	defer d.Close(context.Background())
	d.Deliver(Delivery{URL: r.URL, Secret: "s", Event: Event{Event: "connect", ProjectID: "p", ConnectionID: "c", Timestamp: "2026-01-01T00:00:00.000Z"}})
	first, second := r.next(t), r.next(t)
	if first.body != second.body || !first.signed || !second.signed || first.ev.ID == "" || first.idHeader != first.ev.ID {
		t.Fatalf("attempts differ or are unsigned: %+v %+v", first, second)
	}
	want := fmt.Sprintf(`{"id":%q,"event":"connect","projectId":"p","connectionId":"c","timestamp":"2026-01-01T00:00:00.000Z"}`, first.ev.ID)
	if first.body != want || len(first.ev.ID) != 22 {
		t.Fatalf("body %s, want %s", first.body, want)
	}
	rec := waitRecord(t, d, "p", first.ev.ID, func(r Record) bool { return r.Status == StatusDelivered })
	if rec.Attempts != 2 || rec.StatusCode != 204 || rec.LastError != "HTTP 500" || rec.Event != "connect" || !rec.NextAttemptAt.IsZero() {
		t.Fatalf("record %+v", rec)
	}
	st := waitStats(t, d, func(s Stats) bool { return s.Sent == 1 })
	if st.Retried != 1 || st.Failed != 0 || st.Queued != 0 || st.ProjectsQueued != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestRetriedStatuses: 408, 429 and 5xx are retried; other 4xx and 3xx are
// not.
func TestRetriedStatuses(t *testing.T) {
	for status, retried := range map[int]bool{400: false, 401: false, 404: false, 410: false, 301: false,
		408: true, 429: true, 500: true, 502: true, 503: true} {
		r := newScripted(t, "s", status, 200)
		d := New(fastRetries(Config{}))
		d.Deliver(Delivery{URL: r.URL, Secret: "s", Event: Event{Event: "connect", ProjectID: "p"}})
		id := r.next(t).ev.ID
		if retried {
			r.next(t)
			waitRecord(t, d, "p", id, func(r Record) bool { return r.Status == StatusDelivered && r.Attempts == 2 })
		} else {
			rec := waitRecord(t, d, "p", id, func(r Record) bool { return r.Status == StatusFailed })
			if rec.Attempts != 1 || rec.StatusCode != status || rec.LastError != fmt.Sprint("HTTP ", status) {
				t.Fatalf("%d: record %+v", status, rec)
			}
			if st := d.Stats(); st.Failed != 1 || st.Retried != 0 {
				t.Fatalf("%d: stats %+v", status, st)
			}
		}
		d.Close(context.Background())
		select {
		case a := <-r.got:
			t.Fatalf("%d: one attempt too many: %+v", status, a)
		default:
		}
	}
}

// TestRetriesGiveUp: a receiver down for good gets attempts until the
// bound, then the event counts as failed; MaxAttempts bounds them too.
func TestRetriesGiveUp(t *testing.T) {
	r := newScripted(t, "s", 503)
	d := New(fastRetries(Config{RetryFor: 300 * time.Millisecond}))
	defer d.Close(context.Background())
	start := time.Now()
	d.Deliver(Delivery{URL: r.URL, Secret: "s", Event: Event{Event: "connect", ProjectID: "p"}})
	id := r.next(t).ev.ID
	rec := waitRecord(t, d, "p", id, func(r Record) bool { return r.Status == StatusFailed })
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("gave up after %v, bound 300 ms", took)
	}
	if rec.Attempts < 3 || rec.LastAttemptAt.Sub(rec.CreatedAt) > 300*time.Millisecond+time.Second || rec.LastError != "HTTP 503" {
		t.Fatalf("record %+v", rec)
	}
	if st := d.Stats(); st.Failed != 1 || st.Retried != int64(rec.Attempts-1) || st.Queued != 0 {
		t.Fatalf("stats %+v, record %+v", st, rec)
	}

	r2 := newScripted(t, "s", 503)
	d2 := New(fastRetries(Config{MaxAttempts: 3}))
	defer d2.Close(context.Background())
	d2.Deliver(Delivery{URL: r2.URL, Secret: "s", Event: Event{Event: "connect", ProjectID: "q"}})
	rec = waitRecord(t, d2, "q", r2.next(t).ev.ID, func(r Record) bool { return r.Status == StatusFailed })
	if rec.Attempts != 3 {
		t.Fatalf("MaxAttempts 3: record %+v", rec)
	}
}

// TestRetryDelays: exponential, capped, with at most half taken off; a
// longer Retry-After is honoured up to the cap.
func TestRetryDelays(t *testing.T) {
	d := New(Config{})
	defer d.Close(context.Background())
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	for attempt, full := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 6: 32 * time.Second, 7: time.Minute, 9: time.Minute} {
		for range 100 {
			got, ok := d.retryDelay(&job{attempt: attempt, first: now}, result{retryable: true}, now)
			if !ok || got > full || got < full/2 {
				t.Fatalf("attempt %d: %v %v, want %v less up to half", attempt, got, ok, full)
			}
		}
	}
	if got, _ := d.retryDelay(&job{attempt: 1, first: now}, result{retryable: true, retryAfter: 30 * time.Second}, now); got != 30*time.Second {
		t.Fatalf("Retry-After 30: %v", got)
	}
	if got, _ := d.retryDelay(&job{attempt: 1, first: now}, result{retryable: true, retryAfter: time.Hour}, now); got != time.Minute {
		t.Fatalf("Retry-After 3600: %v", got)
	}
	if _, ok := d.retryDelay(&job{attempt: 10, first: now}, result{retryable: true}, now); ok {
		t.Fatal("an 11th attempt")
	}
	if _, ok := d.retryDelay(&job{attempt: 2, first: now.Add(-299 * time.Second)}, result{retryable: true}, now); ok {
		t.Fatal("an attempt past 5 minutes")
	}
	if _, ok := d.retryDelay(&job{attempt: 1, first: now}, result{}, now); ok {
		t.Fatal("a final failure retried")
	}
	if retryAfter("12") != 12*time.Second || retryAfter("Wed, 21 Oct 2015 07:28:00 GMT") != 0 || retryAfter("-1") != 0 {
		t.Fatal("retryAfter")
	}
}

// TestRetryAfterFromTheReceiver: a 503 with Retry-After: 1 puts the next
// attempt 1 s after the failed one (longer than the backoff's 20 ms, under
// the cap); a 503 without it waits the backoff (RetryBase, less up to
// half: 4 s there, so that the record is seen retrying).
func TestRetryAfterFromTheReceiver(t *testing.T) {
	for header, base := range map[string]time.Duration{"1": 20 * time.Millisecond, "": 4 * time.Second} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if header != "" {
				w.Header().Set("Retry-After", header)
			}
			w.WriteHeader(http.StatusServiceUnavailable)
		}))
		cfg := fastRetries(Config{})
		cfg.RetryBase, cfg.RetryMaxDelay = base, 10*time.Second
		d := New(cfg)
		d.Deliver(Delivery{URL: srv.URL, Secret: "s", Event: Event{Event: "connect", ProjectID: "p"}})
		rec := waitUntil(t, "the first attempt's failure", func() []Record { return d.Deliveries("p") }, func(rs []Record) bool {
			return len(rs) == 1 && rs[0].Status == StatusRetrying
		})[0]
		wait := rec.NextAttemptAt.Sub(rec.LastAttemptAt)
		switch {
		case rec.Attempts != 1 || rec.StatusCode != 503:
			t.Errorf("Retry-After %q: record %+v", header, rec)
		case header != "" && wait != time.Second:
			t.Errorf("Retry-After %q: the next attempt %v after the failed one, want 1s", header, wait)
		case header == "" && (wait < base/2 || wait > base):
			t.Errorf("no Retry-After: the next attempt %v after the failed one, want the backoff (%v less up to half)", wait, base)
		}
		d.Close(context.Background())
		srv.Close()
	}
}

// TestFailingProjectDelaysNobody: project A's receiver times out on every
// attempt and its events are retried over and over; project B's events
// still go out within a bound, A never holds more than its in-flight share,
// and A's retries count in its own queue, never B's.
func TestFailingProjectDelaysNobody(t *testing.T) {
	hang := make(chan struct{})
	a := newReceiver(t, "a", http.StatusOK, hang)
	b := newReceiver(t, "b", http.StatusOK, nil)
	d := New(fastRetries(Config{Workers: 3, ProjectInFlight: 2, ProjectQueue: 20, Timeout: 100 * time.Millisecond}))
	defer d.Close(context.Background())
	defer close(hang)
	for i := range 100 {
		d.Deliver(Delivery{URL: a.URL, Secret: "a", Event: Event{Event: "connect", ProjectID: "A", ConnectionID: fmt.Sprint(i)}})
	}
	waitStats(t, d, func(s Stats) bool { return s.Retried >= 10 }) // A's retries are going round
	for i := range 20 {
		start := time.Now()
		d.Deliver(Delivery{URL: b.URL, Secret: "b", Event: Event{Event: "connect", ProjectID: "B", ConnectionID: fmt.Sprint(i)}})
		select {
		case <-b.events:
		case <-time.After(2 * time.Second):
			t.Fatalf("B's event %d not delivered within 2 s behind A's failing receiver", i)
		}
		if took := time.Since(start); took > 500*time.Millisecond {
			t.Fatalf("B's event %d took %v", i, took)
		}
		if st := d.Stats(); st.InFlight > 3 || st.Queued > 20 {
			t.Fatalf("stats %+v", st)
		}
	}
	st := waitStats(t, d, func(s Stats) bool { return s.Sent == 20 })
	if st.DroppedBy[DropProjectQueueFull] < 100-20-2 || st.DroppedBy[DropQueueFull] != 0 { // at most 2 were under way when A queued
		t.Fatalf("stats %+v", st)
	}
	for _, r := range d.Deliveries("B") {
		if r.Status != StatusDelivered || r.Attempts != 1 {
			t.Fatalf("B's record %+v", r)
		}
	}
}

// TestRetryWithoutRoomIsDropped: a retry needs room in its project's queue;
// without it the event is dropped (counted as its project's) and its record
// says so. Close drops the retries still waiting.
func TestRetryWithoutRoomIsDropped(t *testing.T) {
	hold := make(chan struct{})
	release := sync.OnceFunc(func() { close(hold) })
	defer release()
	var calls atomic.Int64
	first := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if calls.Add(1) == 1 {
			close(first)
			<-hold
		}
		w.WriteHeader(500)
	}))
	defer srv.Close()
	d := New(Config{AllowPrivate: true, Workers: 1, ProjectQueue: 2, Timeout: 5 * time.Second, RetryBase: time.Hour, RetryMaxDelay: time.Hour, RetryFor: 2 * time.Hour})
	deliver := func(i int) {
		d.Deliver(Delivery{URL: srv.URL, Secret: "s", Event: Event{Event: "connect", ProjectID: "p", ConnectionID: fmt.Sprint(i)}})
	}
	deliver(0)
	<-first // the first is under way
	deliver(1)
	deliver(2) // two wait: the queue is full
	recs := d.Deliveries("p")
	release()
	st := waitStats(t, d, func(s Stats) bool { return s.InFlight == 0 && s.Retrying == 2 })
	if st.DroppedBy[DropProjectQueueFull] != 1 || st.Queued != 2 || st.ProjectsFull != 1 {
		t.Fatalf("stats %+v", st)
	}
	dropped := waitRecord(t, d, "p", recs[2].ID, func(r Record) bool { return r.Status == StatusDropped })
	if !strings.Contains(dropped.LastError, "HTTP 500; no room to retry") {
		t.Fatalf("record %+v", dropped)
	}
	if err := d.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	st = d.Stats()
	if st.DroppedBy[DropShutdown] != 2 || st.Queued != 0 || st.Retrying != 0 || st.ProjectsQueued != 0 {
		t.Fatalf("after Close: %+v", st)
	}
	for _, r := range d.Deliveries("p") {
		if r.Status != StatusDropped {
			t.Fatalf("after Close: %+v", r)
		}
	}
}

// TestRefusalsLoggedOncePerMinute: a refused target is logged once per
// project per minute, the next line counting the refusals left out.
func TestRefusalsLoggedOncePerMinute(t *testing.T) {
	r := newScripted(t, "s", 200)
	var logs syncBuffer
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	d := New(Config{Timeout: time.Second, Now: clock, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	defer d.Close(context.Background())
	for range 5 {
		d.Deliver(Delivery{URL: r.URL + "/hook?token=s3cret", Secret: "s", Event: Event{Event: "connect", ProjectID: "p"}})
	}
	d.Deliver(Delivery{URL: r.URL, Secret: "s", Event: Event{Event: "connect", ProjectID: "q"}})
	waitStats(t, d, func(s Stats) bool { return s.Refused == 6 })
	if n := strings.Count(logs.String(), "webhook refused before sending"); n != 2 {
		t.Fatalf("%d lines, want one for p and one for q:\n%s", n, logs.String())
	}
	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	d.Deliver(Delivery{URL: r.URL + "/hook?token=s3cret", Secret: "s", Event: Event{Event: "connect", ProjectID: "p"}})
	waitStats(t, d, func(s Stats) bool { return s.Refused == 7 })
	out := logs.String()
	if n := strings.Count(out, "webhook refused before sending"); n != 3 || !strings.Contains(out, "project=p") ||
		!strings.Contains(out, "suppressed=4") || strings.Contains(out, "s3cret") || !strings.Contains(out, "/hook?redacted") {
		t.Fatalf("logs:\n%s", out)
	}
	for _, rec := range d.Deliveries("p") {
		if rec.Status != StatusRefused || rec.Attempts != 1 || !strings.Contains(rec.LastError, "non-public address") {
			t.Fatalf("record %+v", rec)
		}
	}
	select {
	case a := <-r.got:
		t.Fatalf("a refused target got %+v", a)
	default:
	}
}

// TestHistoryBounded: the last History records of each project, newest
// first, over at most HistoryProjects projects.
func TestHistoryBounded(t *testing.T) {
	r := newScripted(t, "s", 200)
	d := New(Config{AllowPrivate: true, History: 3, HistoryProjects: 2})
	defer d.Close(context.Background())
	send := func(project string, i int) {
		d.Deliver(Delivery{URL: r.URL, Secret: "s", Event: Event{ID: fmt.Sprint(project, i), Event: "connect", ProjectID: project}})
	}
	for i := range 5 {
		send("a", i)
	}
	send("b", 0)
	waitStats(t, d, func(s Stats) bool { return s.Sent == 6 })
	ids := func(project string) string {
		var out []string
		for _, r := range d.Deliveries(project) {
			out = append(out, r.ID)
		}
		return fmt.Sprint(out)
	}
	if got := ids("a"); got != "[a4 a3 a2]" {
		t.Fatalf("a: %s", got)
	}
	send("c", 0) // a was the least recently active: forgotten
	waitStats(t, d, func(s Stats) bool { return s.Sent == 7 })
	if ids("a") != "[]" || ids("b") != "[b0]" || ids("c") != "[c0]" {
		t.Fatalf("a %s b %s c %s", ids("a"), ids("b"), ids("c"))
	}
}

// TestTestEvent: a test event goes the way of any other; a full queue or a
// closed dispatcher refuses it at once.
func TestTestEvent(t *testing.T) {
	r := newScripted(t, "s", 200)
	d := New(Config{AllowPrivate: true, ProjectQueue: 1, Workers: 1})
	rec, err := d.Test("p", r.URL, "s")
	if err != nil || rec.Status != StatusPending || rec.Event != "test" || len(rec.ID) != 22 {
		t.Fatalf("%+v %v", rec, err)
	}
	a := r.next(t)
	if !a.signed || a.ev.ID != rec.ID || a.ev.Event != "test" || a.ev.ProjectID != "p" || a.ev.Timestamp == "" {
		t.Fatalf("attempt %+v", a)
	}
	waitRecord(t, d, "p", rec.ID, func(r Record) bool { return r.Status == StatusDelivered && r.StatusCode == 200 })
	d.Close(context.Background())
	if _, err := d.Test("p", r.URL, "s"); err != ErrClosed {
		t.Fatalf("after Close: %v", err)
	}

	hold := make(chan struct{})
	slow := newReceiver(t, "s", http.StatusOK, hold)
	d2 := New(Config{AllowPrivate: true, ProjectQueue: 1, Workers: 1, ProjectInFlight: 1, Timeout: 30 * time.Second})
	defer d2.Close(context.Background())
	defer close(hold) // first: the receiver answers, so Close can drain
	d2.Test("p", slow.URL, "s")
	<-slow.events // under way
	if _, err := d2.Test("p", slow.URL, "s"); err != nil {
		t.Fatal(err) // waits
	}
	if _, err := d2.Test("p", slow.URL, "s"); err != ErrQueueFull {
		t.Fatalf("a third: %v", err)
	}
}
