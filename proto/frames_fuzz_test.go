package proto

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzDecodeClientMessage: DecodeClientMessage never panics and agrees with
// clientMessageModel, PROTOCOL.md › Client actions read independently on top
// of a generic JSON parse, for every input: the same error (code and echoed
// channel) or the same decoded message. Accepted messages have a supported
// action and, except ping, a valid channel; the frames the connection actor
// builds from the result (ack, error) are valid JSON that echo the channel.
func FuzzDecodeClientMessage(f *testing.F) {
	for _, s := range []string{
		`{"action":"ping"}`,
		`{"action":"subscribe","channel":"room"}`,
		`{"action":"subscribe","channel":"room","presence":true,"clientId":"ann","since":41}`,
		`{"action":"subscribe","channel":"room","presence":true}`,
		`{"action":"subscribe","channel":"room","since":"3"}`,
		`{"action":"subscribe","channel":"room","since":null}`,
		`{"action":"subscribe","channel":"room","since":1e400}`,
		`{"action":"subscribe","channel":"room","since":-0.5e-3}`,
		`{"action":"unsubscribe","channel":"a.b:c"}`,
		`{"action":"emit","channel":"room","type":"chat","payload":{"x":[1,2]},"token":"e30.e30.x"}`,
		`{"action":"emit","channel":"room","payload":null}`,
		`{"action":"publish","channel":"room"}`,
		`{"action":7}`,
		`{"action":"subscribe","channel":"bad channel"}`,
		`{"action":"subscribe","channel":"\u00e9\"<>"}`,
		`{"action":"subscribe","channel":42}`,
		`{"action":"subscribe","channel":"a","channel":"b c"}`,
		`{"ACTION":"ping"}`,
		`{"action":"subscribe","Channel":"room","ſince":"x"}`,
		`[{"action":"ping"}]`,
		`null`,
		` {"action":"ping"} `,
		`{"action":"ping"}{}`,
		`{"action":"ping"`,
		"{\"action\":\"subscribe\",\"channel\":\"\xff\"}",
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, gerr := DecodeClientMessage(b)
		want, werr := clientMessageModel(b)
		if !sameError(gerr, werr) {
			t.Fatalf("%q: error %v, model says %v", b, gerr, werr)
		}
		if gerr != nil {
			checkErrorFrame(t, gerr)
			return
		}
		if !sameClientMessage(got, want) {
			t.Fatalf("%q:\n got %+v\nwant %+v", b, got, want)
		}
		if got.Action == ActionPing {
			return
		}
		if !ValidChannel(got.Channel) {
			t.Fatalf("%q: accepted channel %q", b, got.Channel)
		}
		if got.HasSince && (math.IsNaN(got.Since) || math.IsInf(got.Since, 0)) {
			t.Fatalf("%q: since %v", b, got.Since)
		}
		if got.Presence && got.ClientID == "" {
			t.Fatalf("%q: presence without clientId accepted", b)
		}
		if len(got.Payload) > 0 && (!json.Valid(got.Payload) || !utf8.Valid(got.Payload)) {
			t.Fatalf("%q: payload %q is not JSON in UTF-8 (it is relayed in text frames)", b, got.Payload)
		}
		if ack := AppendAck(nil, got.Action, got.Channel); !json.Valid(ack) {
			t.Fatalf("ack %q is not JSON", ack)
		}
	})
}

// checkErrorFrame: the error frame for e is valid JSON and carries e's code
// and channel exactly.
func checkErrorFrame(t *testing.T, e *Error) {
	t.Helper()
	frame := AppendError(nil, e)
	var back struct {
		Error   string  `json:"error"`
		Channel *string `json:"channel"`
	}
	if err := json.Unmarshal(frame, &back); err != nil {
		t.Fatalf("error frame %q: %v", frame, err)
	}
	ch := ""
	if back.Channel != nil {
		ch = *back.Channel
	}
	if back.Error != string(e.Code) || ch != e.Channel || (e.Code == CodeInvalidChannel && back.Channel == nil) {
		t.Fatalf("error frame %q for %+v", frame, e)
	}
}

func sameError(a, b *Error) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func sameClientMessage(a, b ClientMessage) bool {
	return a.Action == b.Action && a.Channel == b.Channel && bytes.Equal(a.RawChan, b.RawChan) &&
		a.Presence == b.Presence && a.ClientID == b.ClientID && a.HasSince == b.HasSince &&
		a.Since == b.Since && a.Type == b.Type && bytes.Equal(a.Payload, b.Payload) && sameError(a.PayloadErr, b.PayloadErr) && a.Token == b.Token
}

// ---- the model ----

// member is one "key": value of a JSON object, in document order.
type member struct {
	key   string
	value json.RawMessage
}

// objectMembers parses b, which must be one JSON object and nothing else, in
// UTF-8 (RFC 8259 § 8.1; json.Valid lets invalid UTF-8 through in strings).
func objectMembers(b []byte) ([]member, bool) {
	if !json.Valid(b) || !utf8.Valid(b) || !bytes.HasPrefix(bytes.TrimLeft(b, " \t\r\n"), []byte("{")) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if _, err := dec.Token(); err != nil {
		return nil, false
	}
	var out []member
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return nil, false
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, false
		}
		out = append(out, member{key: k.(string), value: v})
	}
	return out, true
}

// fields maps each wanted field to the raw value of the last member naming
// it. Names match as encoding/json matches struct fields: exactly or else
// case-insensitively (Unicode simple folding, so "ſince" names since).
// PROTOCOL.md spells every field in lower camel case; the leniency is
// encoding/json's, kept here so the model describes the decoder as it is.
func fields(ms []member, names ...string) map[string]json.RawMessage {
	out := map[string]json.RawMessage{}
	for _, m := range ms {
		for _, n := range names {
			if strings.EqualFold(m.key, n) {
				out[n] = m.value
			}
		}
	}
	return out
}

// jsonString is the value of a JSON string, ok false for any other value.
func jsonString(raw json.RawMessage) (string, bool) {
	var v any
	if raw == nil || json.Unmarshal(raw, &v) != nil {
		return "", false
	}
	s, ok := v.(string)
	return s, ok
}

func clientMessageModel(b []byte) (ClientMessage, *Error) {
	ms, ok := objectMembers(b)
	if !ok {
		return ClientMessage{}, &Error{Code: CodeInvalidJSON}
	}
	fs := fields(ms, "action", "channel", "presence", "clientId", "since", "type", "payload", "token")
	var m ClientMessage
	m.Action, _ = jsonString(fs["action"])
	switch m.Action {
	case "ping":
		return m, nil
	case "subscribe", "unsubscribe", "emit":
	default:
		return m, &Error{Code: CodeUnknownAction}
	}
	m.RawChan = fs["channel"]
	ch, isString := jsonString(fs["channel"])
	if !isString || !specChannel(ch) {
		return m, &Error{Code: CodeInvalidChannel, Channel: ch}
	}
	m.Channel = ch
	switch m.Action {
	case "subscribe":
		var presence any
		json.Unmarshal(fs["presence"], &presence)
		m.Presence = presence == true
		m.ClientID, _ = jsonString(fs["clientId"])
		if m.Presence && m.ClientID == "" {
			return m, &Error{Code: CodeClientIDRequired, Channel: ch}
		}
		if raw, present := fs["since"]; present && string(raw) != "null" {
			// A number, and one a float64 holds (1e400 is not).
			var v any
			err := json.Unmarshal(raw, &v)
			n, isNumber := v.(float64)
			if err != nil || !isNumber {
				return m, &Error{Code: CodeInvalidSince, Channel: ch}
			}
			m.HasSince, m.Since = true, n
		}
	case "emit":
		m.Type, _ = jsonString(fs["type"])
		m.Token, _ = jsonString(fs["token"])
		m.ClientID, _ = jsonString(fs["clientId"])
		// Relayed compact, "null" when absent; over the cap the error waits for rule 7.
		m.Payload = []byte("null")
		if raw, present := fs["payload"]; present {
			var buf bytes.Buffer
			if err := json.Compact(&buf, raw); err != nil {
				m.Payload, m.PayloadErr = nil, &Error{Code: CodeInvalidJSON}
			} else {
				m.Payload = buf.Bytes()
			}
		}
		if m.PayloadErr == nil && len(`{"channel":"`)+len(ch)+len(`","payload":`)+len(m.Payload)+len(`}`) > MaxMessageBytes {
			m.Payload, m.PayloadErr = nil, &Error{Code: CodePayloadTooLarge}
		}
	}
	return m, nil
}
