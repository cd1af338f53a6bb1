package proto

import (
	"bytes"
	"encoding/json"
)

// EmitRequest is a decoded POST /emit body.
type EmitRequest struct {
	Channel string
	Payload []byte // compact JSON; "null" when the field was absent
}

// DecodeEmitRequest parses {channel, payload} in SPEC.md's order of checks:
// invalid_json (not a JSON object), invalid_channel (missing, not a string,
// or breaking the name rules), payload_too_large (serialized
// {channel,payload} over MaxMessageBytes, payload measured compact).
func DecodeEmitRequest(body []byte) (EmitRequest, *Error) {
	var w struct {
		Channel json.RawMessage `json:"channel"`
		Payload json.RawMessage `json:"payload"`
	}
	if err := json.Unmarshal(body, &w); err != nil || !isObject(body) {
		return EmitRequest{}, &Error{Code: CodeInvalidJSON}
	}
	ch, ok := rawString(w.Channel)
	if !ok || !ValidChannel(ch) {
		return EmitRequest{}, &Error{Code: CodeInvalidChannel, Channel: channelEcho(w.Channel)}
	}
	payload := []byte("null")
	if len(w.Payload) > 0 {
		var buf bytes.Buffer
		buf.Grow(len(w.Payload))
		if err := json.Compact(&buf, w.Payload); err != nil {
			return EmitRequest{}, &Error{Code: CodeInvalidJSON}
		}
		payload = buf.Bytes()
	}
	if MessageSize(ch, payload) > MaxMessageBytes {
		return EmitRequest{}, &Error{Code: CodePayloadTooLarge}
	}
	return EmitRequest{Channel: ch, Payload: payload}, nil
}
