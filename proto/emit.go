package proto

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
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
	if req, err, ok := decodeEmitUsual(body); ok {
		return req, err
	}
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

// decodeEmitUsual reads the body nearly every emit sends,
// {"channel":"<name without escapes>","payload":<JSON value>} in that order
// (whitespace allowed between tokens), without encoding/json's reflection:
// it was a tenth of an emit's CPU. ok is false for any other body, and for
// any body it cannot wholly vouch for as JSON; DecodeEmitRequest then reads
// it the general way, so the two never answer the same body differently.
func decodeEmitUsual(body []byte) (req EmitRequest, _ *Error, ok bool) {
	if !utf8.Valid(body) {
		return req, nil, false
	}
	i, ok := expectToken(body, 0, '{')
	if ok {
		i, ok = expectKey(body, i, `"channel"`)
	}
	if !ok {
		return req, nil, false
	}
	if i = skipSpace(body, i); i >= len(body) || body[i] != '"' {
		return req, nil, false
	}
	start := i + 1
	end := bytes.IndexByte(body[start:], '"')
	if end < 0 {
		return req, nil, false
	}
	end += start
	for _, c := range body[start:end] {
		if c == '\\' || c < 0x20 { // escapes and control characters: the general reader's
			return req, nil, false
		}
	}
	channel := body[start:end]
	if i, ok = expectToken(body, end+1, ','); ok {
		i, ok = expectKey(body, i, `"payload"`)
	}
	if !ok {
		return req, nil, false
	}
	// The payload is everything up to the object's closing brace; Compact
	// (in EmitPayload) refuses anything that is not exactly one JSON value,
	// such as a further key after it.
	value := bytes.TrimRight(body[i:], " \t\r\n")
	if len(value) == 0 || value[len(value)-1] != '}' {
		return req, nil, false
	}
	value = bytes.TrimSpace(value[:len(value)-1])
	if len(value) == 0 {
		return req, nil, false
	}
	ch := string(channel)
	payload, perr := EmitPayload(ch, value)
	if perr != nil && perr.Code == CodeInvalidJSON {
		return req, nil, false
	}
	// The body is valid JSON from here on: the same checks, in the same
	// order, as the general way.
	if !ValidChannel(ch) {
		return req, &Error{Code: CodeInvalidChannel, Channel: ch}, true
	}
	if perr != nil {
		return req, perr, true
	}
	return EmitRequest{Channel: ch, Payload: payload}, nil, true
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// expectToken skips whitespace and one byte c, returning the index after it.
func expectToken(b []byte, i int, c byte) (int, bool) {
	i = skipSpace(b, i)
	if i >= len(b) || b[i] != c {
		return i, false
	}
	return i + 1, true
}

// expectKey skips whitespace, the quoted key and its colon.
func expectKey(b []byte, i int, key string) (int, bool) {
	i = skipSpace(b, i)
	if !bytes.HasPrefix(b[i:], []byte(key)) {
		return i, false
	}
	return expectToken(b, i+len(key), ':')
}
