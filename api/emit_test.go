package api

import (
	"encoding/json"
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
