package api

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/relayhq/relay/actors"
)

// TestAppendEmitOK: the hand-written 200 body of POST /emit is byte for byte
// what json.Encoder makes of emitOK (the shape batch emit results use too).
func TestAppendEmitOK(t *testing.T) {
	reset := time.Date(2026, 11, 24, 1, 2, 3, 456_789_000, time.FixedZone("x", 3600))
	for _, res := range []actors.PublishResult{
		{},
		{Seq: 1764000000123456, Delivered: 2000, Subscribers: 2001,
			Channel: actors.Budget{Limit: 600, Remaining: 599, ResetAt: reset},
			Project: actors.Budget{Limit: 100000000, Remaining: 0, ResetAt: reset.Add(time.Minute)}},
		{Seq: 18446744073709551615, Delivered: 0, Subscribers: 0, Channel: actors.Budget{Remaining: -1}},
	} {
		for _, channel := range []string{"room", "a.b:c_d-e", "x"} {
			want, err := json.Marshal(emitOK{OK: true, Channel: channel, Seq: res.Seq, Delivered: res.Delivered,
				SubscriberCount: res.Subscribers, RateLimit: toBudget(res.Channel), ProjectRateLimit: toBudget(res.Project)})
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, '\n')
			if got := appendEmitOK(nil, channel, res); string(got) != string(want) {
				t.Errorf("got  %s\nwant %s", got, want)
			}
		}
	}
}

// TestAppendTimestamp: the digit-by-digit timestamp is timestampLayout's
// text, across zones, the year's edges, leap days and sub-millisecond times.
func TestAppendTimestamp(t *testing.T) {
	times := []time.Time{
		{},
		time.Unix(0, 0),
		time.Date(2026, 11, 24, 1, 2, 3, 456_789_000, time.FixedZone("x", 3600)),
		time.Date(2024, 2, 29, 23, 59, 59, 999_999_999, time.UTC),
		time.Date(1999, 12, 31, 23, 59, 59, 0, time.FixedZone("y", -5*3600)),
		time.Date(9999, 12, 31, 23, 59, 59, 1_000_000, time.UTC),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
	}
	for i := range 1000 {
		times = append(times, time.Unix(int64(i)*7_777_777, int64(i)*999_983).In(time.FixedZone("z", (i%25-12)*3600)))
	}
	for _, tm := range times {
		if got, want := string(appendTimestamp(nil, tm)), tm.UTC().Format(timestampLayout); got != want {
			t.Errorf("%v: %s, want %s", tm, got, want)
		}
	}
}

// TestHTTPDate: POST /emit's Date is net/http's format of the second, made
// once per second.
func TestHTTPDate(t *testing.T) {
	var d httpDate
	t0 := time.Date(2026, 11, 25, 22, 40, 5, 100_000_000, time.FixedZone("x", 3600))
	first := d.at(t0)
	if want := t0.UTC().Format(http.TimeFormat); len(first) != 1 || first[0] != want {
		t.Fatalf("Date %q, want %q", first, want)
	}
	if same := d.at(t0.Add(800 * time.Millisecond)); &same[0] != &first[0] {
		t.Error("a second Date made within the same second")
	}
	next := d.at(t0.Add(time.Second))
	if want := t0.Add(time.Second).UTC().Format(http.TimeFormat); next[0] != want {
		t.Errorf("next second's Date %q, want %q", next[0], want)
	}
}
