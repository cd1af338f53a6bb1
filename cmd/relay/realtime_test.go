package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/store/storetest"
)

// emit posts to /emit with a bearer key ("" sends no Authorization header).
func (c *client) emit(secretKey, body string) response {
	c.t.Helper()
	req, _ := http.NewRequest("POST", c.ts.base+"/emit", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if secretKey != "" {
		req.Header.Set("Authorization", "Bearer "+secretKey)
	}
	res, err := c.http.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer res.Body.Close()
	var r response
	r.status, r.header = res.StatusCode, res.Header
	var sb strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := res.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			break
		}
	}
	r.raw = sb.String()
	json.Unmarshal([]byte(r.raw), &r.json)
	return r
}

func num(m map[string]any, k string) float64 { f, _ := m[k].(float64); return f }

func TestSubscribeAndEmit(t *testing.T) {
	storetest.EachDB(t, func(t *testing.T, url string) {
		ts := startServer(t, url, nil)
		owner := ts.signup("alice@example.com")
		p := owner.createProject("demo")

		sub := ts.dialWS(p.publicKey)
		sub.send(`{"action":"subscribe","channel":"room:1"}`)
		sub.expect(`{"action":"subscribe","channel":"room:1","ok":true}`)

		r := owner.emit(p.secretKey, `{"channel":"room:1","payload":{"text":"hi", "n": [1, 2]}}`)
		if r.status != 200 {
			t.Fatalf("emit: %d %s", r.status, r.raw)
		}
		seq := num(r.json, "seq")
		if r.json["ok"] != true || r.json["channel"] != "room:1" || num(r.json, "delivered") != 1 || num(r.json, "subscriberCount") != 1 || seq <= 0 {
			t.Fatalf("emit body: %s", r.raw)
		}
		for _, k := range []string{"rate_limit", "project_rate_limit"} {
			b, _ := r.json[k].(map[string]any)
			if b == nil || num(b, "limit") == 0 || b["resetAt"] == nil {
				t.Fatalf("%s missing or malformed in %s", k, r.raw)
			}
		}
		sub.expect(fmt.Sprintf(`{"channel":"room:1","payload":{"text":"hi","n":[1,2]},"seq":%d}`, int64(seq)))

		r2 := owner.emit(p.secretKey, `{"channel":"room:1","payload":2}`)
		if num(r2.json, "seq") <= seq {
			t.Fatalf("seq did not increase: %v then %v", seq, r2.json["seq"])
		}
		sub.expect(fmt.Sprintf(`{"channel":"room:1","payload":2,"seq":%d}`, int64(num(r2.json, "seq"))))

		sub.send(`{"action":"ping"}`)
		sub.expect(`{"action":"pong","ok":true}`)
		sub.send(`{"action":"unsubscribe","channel":"room:1"}`)
		sub.expect(`{"action":"unsubscribe","channel":"room:1","ok":true}`)
		if r := owner.emit(p.secretKey, `{"channel":"room:1","payload":3}`); num(r.json, "delivered") != 0 || num(r.json, "subscriberCount") != 0 {
			t.Fatalf("after unsubscribe: %s", r.raw)
		}
		sub.expectSilence(200 * time.Millisecond)
	})
}
