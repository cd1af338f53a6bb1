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

// DecodeEmitRequest parses {channel, payload} in PROTOCOL.md's order of checks (› POST /emit):
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
	payload, perr := EmitPayload(ch, w.Payload)
	if perr != nil {
		return EmitRequest{}, perr
	}
	return EmitRequest{Channel: ch, Payload: payload}, nil
}

// EmitPayload is the payload of an emit on channel as it is relayed: raw
// compacted ("null" when absent), then checked against MaxMessageBytes. It
// is the one check for both emit paths, POST /emit and a client's emit
// action: invalid_json for a raw value that is not JSON, payload_too_large
// over the cap.
func EmitPayload(channel string, raw []byte) ([]byte, *Error) {
	payload := []byte("null")
	if len(raw) > 0 {
		var buf bytes.Buffer
		buf.Grow(len(raw))
		if err := json.Compact(&buf, raw); err != nil {
			return nil, &Error{Code: CodeInvalidJSON}
		}
		payload = buf.Bytes()
	}
	if MessageSize(channel, payload) > MaxMessageBytes {
		return nil, &Error{Code: CodePayloadTooLarge}
	}
	return payload, nil
}
