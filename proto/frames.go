package proto

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// Client actions of PROTOCOL.md › Client actions.
const (
	ActionSubscribe   = "subscribe"
	ActionUnsubscribe = "unsubscribe"
	ActionEmit        = "emit"
	ActionPing        = "ping"
	// ActionRefresh presents a fresh connection token (channel authorization);
	// on a project without it, it is answered unknown_action.
	ActionRefresh = "refresh"
)

// ClientMessage is one decoded client frame. Fields whose JSON type the spec
// constrains are kept raw so each rule can answer with its own code.
type ClientMessage struct {
	Action   string
	Channel  string          // a valid name; set only when the channel passed its check
	RawChan  json.RawMessage // the channel value as sent, echoed in invalid_channel
	Presence bool
	ClientID string
	HasSince bool
	Since    float64
	Type     string
	// Payload of an emit, compact and within MaxMessageBytes (EmitPayload);
	// when it is not, PayloadErr holds payload_too_large, which the project
	// actor answers in its turn (client-emit rule 7, after rules 1–6).
	Payload    []byte
	PayloadErr *Error
	Token      string
}

type wireClientMessage struct {
	Action   json.RawMessage `json:"action"`
	Channel  json.RawMessage `json:"channel"`
	Presence json.RawMessage `json:"presence"`
	ClientID json.RawMessage `json:"clientId"`
	Since    json.RawMessage `json:"since"`
	Type     json.RawMessage `json:"type"`
	Payload  json.RawMessage `json:"payload"`
	Token    json.RawMessage `json:"token"`
}

// DecodeClientMessage turns one client frame into a ClientMessage, or the
// spec error for it: invalid_json, unknown_action, invalid_channel,
// client_id_required or invalid_since. Rules of the emit action beyond its
// shape are the project actor's; its payload is compacted and measured here,
// once, by EmitPayload.
func DecodeClientMessage(b []byte) (ClientMessage, *Error) {
	var w wireClientMessage
	if err := json.Unmarshal(b, &w); err != nil || !isObject(b) {
		return ClientMessage{}, &Error{Code: CodeInvalidJSON}
	}
	var m ClientMessage
	m.Action, _ = rawString(w.Action)
	switch m.Action {
	case ActionPing:
		return m, nil
	case ActionRefresh:
		m.Token, _ = rawString(w.Token)
		return m, nil
	case ActionSubscribe, ActionUnsubscribe, ActionEmit:
	default:
		return m, &Error{Code: CodeUnknownAction}
	}
	m.RawChan = w.Channel
	ch, ok := rawString(w.Channel)
	if !ok || !ValidChannel(ch) {
		return m, &Error{Code: CodeInvalidChannel, Channel: channelEcho(w.Channel)}
	}
	m.Channel = ch
	switch m.Action {
	case ActionSubscribe:
		m.Presence = isTrue(w.Presence)
		m.ClientID, _ = rawString(w.ClientID)
		m.Token, _ = rawString(w.Token) // a subscribe token: channel authorization only
		if m.Presence && m.ClientID == "" {
			return m, &Error{Code: CodeClientIDRequired, Channel: ch}
		}
		if len(w.Since) > 0 && !bytes.Equal(w.Since, []byte("null")) {
			n, err := strconv.ParseFloat(string(w.Since), 64)
			if err != nil || w.Since[0] == '"' {
				return m, &Error{Code: CodeInvalidSince, Channel: ch}
			}
			m.HasSince, m.Since = true, n
		}
	case ActionEmit:
		m.Type, _ = rawString(w.Type)
		m.Token, _ = rawString(w.Token)
		m.ClientID, _ = rawString(w.ClientID)
		m.Payload, m.PayloadErr = EmitPayload(ch, w.Payload)
	}
	return m, nil
}

// isObject: b is a JSON object, and in UTF-8 as RFC 8259 § 8.1 requires
// (encoding/json lets invalid UTF-8 through inside strings, and a raw payload
// is relayed in text frames, which a client must drop with 1007 if not UTF-8).
func isObject(b []byte) bool {
	b = bytes.TrimLeft(b, " \t\r\n")
	return len(b) > 0 && b[0] == '{' && utf8.Valid(b)
}

func isTrue(raw json.RawMessage) bool { return bytes.Equal(raw, []byte("true")) }

// rawString unquotes a JSON string value; ok is false for any other type.
func rawString(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || raw[0] != '"' {
		return "", false
	}
	// The common case, a string with no escapes, needs no decoding (raw has
	// been checked as JSON by the Unmarshal that produced it).
	if len(raw) >= 2 && raw[len(raw)-1] == '"' {
		if inner := raw[1 : len(raw)-1]; bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
			return string(inner), true
		}
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// channelEcho is the channel value put back into an invalid_channel error: the
// string as sent, or "" when it was missing or not a string.
func channelEcho(raw json.RawMessage) string {
	s, _ := rawString(raw)
	return s
}

// Server → client frames. Each Append* writes one JSON object; the channel
// actor calls them once per message and shares the bytes with every subscriber.

// AppendMessage appends {"channel":…,"payload":…,"seq":…}. payload must be
// valid compact JSON; channel names are validated and never need escaping.
func AppendMessage(dst []byte, channel string, payload []byte, seq uint64) []byte {
	dst = append(dst, `{"channel":"`...)
	dst = append(dst, channel...)
	dst = append(dst, `","payload":`...)
	dst = append(dst, payload...)
	dst = append(dst, `,"seq":`...)
	dst = strconv.AppendUint(dst, seq, 10)
	return append(dst, '}')
}

// AppendAck appends {"action":…,"channel":…,"ok":true}.
func AppendAck(dst []byte, action, channel string) []byte {
	dst = append(dst, `{"action":"`...)
	dst = append(dst, action...)
	dst = append(dst, `","channel":"`...)
	dst = append(dst, channel...)
	return append(dst, `","ok":true}`...)
}

// RefreshOK answers a refresh whose token was taken.
var RefreshOK = []byte(`{"action":"refresh","ok":true}`)

// AppendTokenExpiring appends {"type":"token_expiring","exp":EXP}.
func AppendTokenExpiring(dst []byte, exp int64) []byte {
	dst = append(dst, `{"type":"token_expiring","exp":`...)
	dst = strconv.AppendInt(dst, exp, 10)
	return append(dst, '}')
}

// Pong is the reply to a ping action.
var Pong = []byte(`{"action":"pong","ok":true}`)

// AppendError appends {"error":…} with "channel" when e has one; invalid_channel
// always carries it, empty when the client sent none.
func AppendError(dst []byte, e *Error) []byte {
	dst = append(dst, `{"error":"`...)
	dst = append(dst, e.Code...)
	dst = append(dst, '"')
	if e.Channel != "" || e.Code == CodeInvalidChannel {
		dst = append(dst, `,"channel":`...)
		dst = AppendString(dst, e.Channel)
	}
	return append(dst, '}')
}

// AppendString appends s as a JSON string, escaped. Plain ASCII (the usual
// clientId or type) is copied as is; anything else goes through encoding/json.
func AppendString(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 || c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(s) // a string always marshals
			return append(dst, b...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}
