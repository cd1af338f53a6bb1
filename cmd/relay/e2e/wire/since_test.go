package wire

import (
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// TestSinceSameOnSocketAndHTTP: a since gives the same messages and the same
// gap whether a socket subscribes with it or GET /channels/{channel}/messages
// names it (proto/PROTOCOL.md › subscribe, › Server-side queries and
// actions): any JSON number, fractions, negatives and numbers past every seq
// included; what a socket refuses (not a number, 1e400) HTTP refuses too,
// with invalid_since.
func TestSinceSameOnSocketAndHTTP(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), nil)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	c := ts.Client()
	var seqs []uint64
	for i := range 3 {
		r := owner.Emit(p.SecretKey, fmt.Sprintf(`{"channel":"room","payload":{"n":%d}}`, i))
		seqs = append(seqs, uint64(relaytest.Num(r.JSON, "seq")))
	}
	s1, s2 := seqs[0], seqs[1]

	type answer struct {
		seqs []uint64
		gap  bool
	}
	overSocket := func(since string) answer {
		t.Helper()
		ws := ts.DialWS(p.PublicKey)
		defer ws.Conn.Close()
		ws.Send(`{"action":"subscribe","channel":"room","since":` + since + `}`)
		a := answer{seqs: []uint64{}}
		for {
			f, ok := ws.Next(5 * time.Second)
			if !ok || f.Closed || f.Err != nil {
				t.Fatalf("since %s on the socket: %+v", since, f)
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(f.Text), &m); err != nil {
				t.Fatal(err)
			}
			switch {
			case m["type"] == "replay_gap":
				a.gap = true
			case m["replay"] == true:
				a.seqs = append(a.seqs, uint64(m["seq"].(float64)))
			case m["action"] == "subscribe" && m["ok"] == true:
				return a
			default:
				t.Fatalf("since %s on the socket: %s", since, f.Text)
			}
		}
	}
	overHTTP := func(since string) answer {
		t.Helper()
		r := c.BearerGet("/channels/room/messages?since="+url.QueryEscape(since), p.SecretKey)
		if r.Status != 200 {
			t.Fatalf("since %s over HTTP: %d %s", since, r.Status, r.Raw)
		}
		var body struct {
			Messages []struct{ Seq uint64 }
			Gap      bool
		}
		if err := json.Unmarshal([]byte(r.Raw), &body); err != nil {
			t.Fatal(err)
		}
		a := answer{seqs: []uint64{}, gap: body.Gap}
		for _, m := range body.Messages {
			a.seqs = append(a.seqs, m.Seq)
		}
		return a
	}
	cases := []struct {
		since string
		want  answer
	}{
		{"-1", answer{seqs, true}},
		{"-0.5e-3", answer{seqs, true}},
		{"0", answer{seqs, true}},
		{"0.5", answer{seqs, true}},
		{"1.5", answer{seqs, true}},
		{fmt.Sprint(s1 - 1), answer{seqs, false}},
		{fmt.Sprintf("%d.5", s1-1), answer{seqs, false}},
		{fmt.Sprint(s1), answer{seqs[1:], false}},
		{fmt.Sprintf("%d.25", s1), answer{seqs[1:], false}},
		{fmt.Sprintf("%de0", s2), answer{seqs[2:], false}},
		{"9007199254740993", answer{[]uint64{}, false}},
		{"1e300", answer{[]uint64{}, false}},
	}
	for _, tc := range cases {
		ws, h := overSocket(tc.since), overHTTP(tc.since)
		if ws.gap != h.gap || !slices.Equal(ws.seqs, h.seqs) {
			t.Errorf("since %s: socket %+v, HTTP %+v", tc.since, ws, h)
		}
		if h.gap != tc.want.gap || !slices.Equal(h.seqs, tc.want.seqs) {
			t.Errorf("since %s: %+v, want %+v", tc.since, h, tc.want)
		}
	}
	for _, since := range []string{`"1"`, "1e400", "-1e400"} {
		ws := ts.DialWS(p.PublicKey)
		ws.Send(`{"action":"subscribe","channel":"room","since":` + since + `}`)
		ws.Expect(`{"error":"invalid_since","channel":"room"}`)
		ws.Conn.Close()
		c.BearerGet("/channels/room/messages?since="+url.QueryEscape(since), p.SecretKey).Expect(t, 400, `{"error":"invalid_since"}`)
	}
}
