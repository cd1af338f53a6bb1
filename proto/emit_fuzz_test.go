package proto

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzDecodeEmitRequest: DecodeEmitRequest never panics and agrees with
// emitRequestModel (PROTOCOL.md › POST /emit on top of a generic JSON parse).
// An accepted body has a valid channel and a payload that is valid, compact
// JSON meaning what was sent, within MaxMessageBytes once framed; the frame
// the channel actor builds from it is valid JSON.
func FuzzDecodeEmitRequest(f *testing.F) {
	for _, s := range []string{
		`{"channel":"room","payload":{"a":1}}`,
		`{"channel":"room"}`,
		`{"channel":"room","payload":null}`,
		`{"channel":"room","payload": [ 1 , "two" , {"3" : null} ] }`,
		`{"channel":"room","payload":"\u003c\/script\u003e"}`,
		`{"channel":"room","payload":1e400}`,
		`{"channel":"bad room","payload":1}`,
		`{"channel":5,"payload":1}`,
		`{"payload":1}`,
		`{"channel":"a","channel":"b","payload":2,"payload":3}`,
		`{"CHANNEL":"room","Payload":true}`,
		`[1]`,
		`"room"`,
		`{"channel":"room","payload":1`,
		`{"channel":"room","payload":1} trailing`,
		"{\"channel\":\"room\",\"payload\":\"\xff\"}",
		// The usual-shape reader's edges (decodeEmitUsual): each must fall
		// back to, or agree with, the general reading.
		`{"channel":"room","payload":{"k":1},"channel":"b"}`,
		`{"channel":"room","payload":1}}`,
		`{ "channel" : "ro\u006fm" , "payload" : 2 }`,
		`{"channel":"bad room","payload":{"x":}}`,
		`{"channel":"bad room","payload":1}`,
		`{"channel":"room","payload":}`,
		`{"channel":"room","payload":"}"}`,
		"{\"channel\":\"ro\x01om\",\"payload\":1}",
		` {"channel":"room","payload":[1, 2]} `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(checkEmitRequest)
}

// TestFuzzDecodeEmitRequestLimit runs the fuzz check on bodies around the
// 128 KiB limit, too big to seed the fuzzer with (they slow it to a crawl).
func TestFuzzDecodeEmitRequestLimit(t *testing.T) {
	// {"channel":"room","payload":"xx…"} is 31 bytes plus the x's.
	for _, n := range []int{MaxMessageBytes - 32, MaxMessageBytes - 31, MaxMessageBytes - 30} {
		for _, pad := range []string{"", " \n\t"} {
			body := `{"channel":"room","payload":` + pad + `"` + strings.Repeat("x", n) + `"` + pad + `}`
			checkEmitRequest(t, []byte(body))
			_, err := DecodeEmitRequest([]byte(body))
			if tooBig := n+31 > MaxMessageBytes; (err != nil) != tooBig || (tooBig && err.Code != CodePayloadTooLarge) {
				t.Fatalf("%d x's, pad %q: %v", n, pad, err)
			}
		}
	}
}

func checkEmitRequest(t *testing.T, b []byte) {
	got, gerr := DecodeEmitRequest(b)
	want, werr := emitRequestModel(b)
	if !sameError(gerr, werr) {
		t.Fatalf("%.200q: error %v, model says %v", b, gerr, werr)
	}
	if gerr != nil {
		return
	}
	if got.Channel != want.Channel || !bytes.Equal(got.Payload, want.Payload) {
		t.Fatalf("%.200q:\n got %q %.200q\nwant %q %.200q", b, got.Channel, got.Payload, want.Channel, want.Payload)
	}
	if !ValidChannel(got.Channel) || !json.Valid(got.Payload) {
		t.Fatalf("%.200q: accepted channel %q payload %.200q", b, got.Channel, got.Payload)
	}
	msg := AppendMessage(nil, got.Channel, got.Payload, 7)
	if !json.Valid(msg) || !utf8.Valid(msg) {
		t.Fatalf("message frame %.200q is not JSON in UTF-8 (it goes out in a text frame)", msg)
	}
	if framed := len(msg) - len(`,"seq":7`); framed != MessageSize(got.Channel, got.Payload) || framed > MaxMessageBytes {
		t.Fatalf("framed {channel,payload} is %d bytes, MessageSize %d", framed, MessageSize(got.Channel, got.Payload))
	}
}

// emitRequestModel: invalid_json unless the body is one JSON object in UTF-8;
// invalid_channel unless "channel" is a string obeying the name rules (the
// string echoed); the payload is the "payload" value made compact ("null"
// when absent); payload_too_large when {"channel":…,"payload":…} so written
// is over MaxMessageBytes.
func emitRequestModel(b []byte) (EmitRequest, *Error) {
	ms, ok := objectMembers(b)
	if !ok {
		return EmitRequest{}, &Error{Code: CodeInvalidJSON}
	}
	fs := fields(ms, "channel", "payload")
	ch, isString := jsonString(fs["channel"])
	if !isString || !specChannel(ch) {
		return EmitRequest{}, &Error{Code: CodeInvalidChannel, Channel: ch}
	}
	payload := []byte("null")
	if raw, present := fs["payload"]; present {
		var buf bytes.Buffer
		if err := json.Compact(&buf, raw); err != nil {
			return EmitRequest{}, &Error{Code: CodeInvalidJSON}
		}
		payload = buf.Bytes()
	}
	var framed bytes.Buffer
	enc := json.NewEncoder(&framed)
	enc.SetEscapeHTML(false) // the relay forwards payload bytes as sent
	enc.Encode(struct {
		Channel string          `json:"channel"`
		Payload json.RawMessage `json:"payload"`
	}{ch, payload})
	if len(bytes.TrimSuffix(framed.Bytes(), []byte("\n"))) > MaxMessageBytes {
		return EmitRequest{}, &Error{Code: CodePayloadTooLarge}
	}
	return EmitRequest{Channel: ch, Payload: payload}, nil
}
