package api

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/proto/jwstest"
)

// FuzzSessionVerify: sessions.parse never panics and never accepts a
// service_session token that acceptedSession, an independent reading of
// cmd/relay/OPERATING.md › Sessions' service_session cookie (an HS256 JWT), refuses: the signature must be HMAC-SHA256 with
// SESSION_SECRET, the subject (the user id it returns) a non-empty string,
// and exp present and not past. A session it issued verifies.
//
// mode picks what the fuzzer controls, as in actors' FuzzVerifyEmitToken: 0
// the whole token; 1 header and claims JSON, signed correctly; 2 the same
// signed with another key; 3 header and claims JSON with sig as the raw
// signature part.
func FuzzSessionVerify(f *testing.F) {
	const hs = `{"alg":"HS256","typ":"JWT"}`
	good := `{"sub":"user-1","iat":1700000000,"exp":1700604800}`
	for _, s := range []struct {
		header, claims, sig string
		mode                uint8
	}{
		{hs, good, "", 1},
		{hs, good, "", 2},
		{`{"alg":"none"}`, good, "", 3},
		{`{"alg":"none"}`, good, "", 1},
		{`{"alg":"HS384"}`, good, "", 1},
		{`{"alg":"HS256","b64":false,"crit":["b64"]}`, good, "", 1},
		{hs, `{"sub":"user-1","exp":0}`, "", 1},
		{hs, `{"sub":"user-1","exp":0.5}`, "", 1},
		{hs, `{"sub":"user-1","exp":1699999999}`, "", 1},
		{hs, `{"sub":"user-1","exp":"2030-01-01T00:00:00Z"}`, "", 1},
		{hs, `{"sub":"user-1"}`, "", 1},
		{hs, `{"sub":"","exp":1700604800}`, "", 1},
		{hs, `{"sub":42,"exp":1700604800}`, "", 1},
		{hs, `{"sub":"user-1","exp":1700604800,"nbf":1800000000}`, "", 1},
		{hs, `{"sub":"user-1","exp":1700604800,"iat":1800000000}`, "", 1},
		{hs, `"just a string"`, "", 1},
		{hs, `{"sub":"a","sub":"b","exp":1700604800}`, "", 1},
		{hs, good, "", 0},
		{`{"sub":"user-1","exp":1700604800}`, "", "", 0},
		{"eyJhbGciOiJub25lIn0.", "eyJzdWIiOiJ1c2VyLTEiLCJleHAiOjE3MDA2MDQ4MDB9", ".", 0},
		{"a.b.c.d.e", "", "", 0},
	} {
		f.Add(s.header, s.claims, s.sig, s.mode)
	}
	key := []byte("session-secret")
	now := time.Unix(1_700_000_000, 0)
	s := &sessions{key: key, now: func() time.Time { return now }}
	issued, err := s.start(context.Background(), "user-1") // no state: epoch 0
	if err != nil {
		f.Fatal(err)
	}
	if sess, err := s.parse(issued); err != nil || sess.userID != "user-1" {
		f.Fatalf("an issued session does not verify: %q, %v", sess.userID, err)
	}
	f.Fuzz(func(t *testing.T, header, claims, sig string, mode uint8) {
		token := jwstest.Token(header, claims, sig, mode, key)
		sess, err := s.parse(token)
		id := sess.userID
		if err != nil {
			if id != "" {
				t.Fatalf("refused %q but returned user %q", token, id)
			}
			return
		}
		if why := acceptedSession(token, key, now, id); why != "" {
			t.Fatalf("accepted %q as user %q: %s", token, id, why)
		}
	})
}

// acceptedSession says what is wrong with accepting token as user id, or "".
func acceptedSession(token string, key []byte, now time.Time, id string) string {
	payload, why := jwstest.HS256Payload(token, key)
	if why != "" {
		return why
	}
	var c map[string]any
	dec := json.NewDecoder(strings.NewReader(string(payload)))
	dec.UseNumber()
	if err := dec.Decode(&c); err != nil {
		return "claims are not a JSON object: " + err.Error()
	}
	if sub, _ := c["sub"].(string); sub == "" || sub != id {
		return "sub " + strconv.Quote(sub)
	}
	// A second's grace for sub-second rounding; sessions allow no skew.
	exp, ok := jwstest.NumericDate(c["exp"])
	if !ok {
		return "exp missing or not a NumericDate"
	}
	if !now.Before(exp.Add(time.Second)) {
		return "expired at " + exp.String()
	}
	for _, name := range []string{"nbf", "iat"} {
		if v, present := c[name]; present {
			if t, ok := jwstest.NumericDate(v); !ok || t.After(now.Add(time.Second)) {
				return name + " in the future"
			}
		}
	}
	return ""
}
