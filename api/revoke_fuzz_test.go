package api

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/relayhq/relay/proto"
)

// FuzzDecodeRevokeRequest: decodeRevokeRequest never panics and agrees with
// revokeRequestModel, proto/PROTOCOL.md › POST /emit-tokens/revoke read
// independently on top of a generic JSON parse. An accepted request has at
// least one of jti and clientId, each exactly the string sent.
func FuzzDecodeRevokeRequest(f *testing.F) {
	for _, s := range []string{
		`{"jti":"j1"}`,
		`{"clientId":"ann"}`,
		`{"jti":"j1","clientId":"ann"}`,
		`{}`,
		`{"jti":""}`,
		`{"jti":null,"clientId":""}`,
		`{"jti":5}`,
		`{"jti":5,"clientId":"ann"}`,
		`{"jti":["j1"]}`,
		`{"jti":"j1","jti":null}`,
		`{"jti":7,"jti":"j1"}`,
		`{"JTI":"j1"}`,
		`{"ClientID":"ann"}`,
		`{"jti":"\u00e9\ud83d\ude00"}`,
		"{\"jti\":\"\xff\"}",
		`{"other":1}`,
		`[]`,
		`null`,
		`"jti"`,
		` {"jti":"j1"}`,
		`{"jti":"j1"} {}`,
		`{"jti":"j1"`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, gerr := decodeRevokeRequest(b)
		want, werr := revokeRequestModel(b)
		if (gerr == nil) != (werr == nil) || gerr != nil && *gerr != *werr {
			t.Fatalf("%q: error %v, model says %v", b, gerr, werr)
		}
		if gerr != nil {
			if gerr.Code != proto.CodeInvalidJSON && gerr.Code != proto.CodeJTIOrClientIDRequired {
				t.Fatalf("%q: code %s is not one of the endpoint's", b, gerr.Code)
			}
			return
		}
		if got != want {
			t.Fatalf("%q: got %+v, model says %+v", b, got, want)
		}
		if got.JTI == "" && got.ClientID == "" {
			t.Fatalf("%q: accepted with neither jti nor clientId", b)
		}
	})
}

// revokeRequestModel: invalid_json unless the body is one JSON object whose
// jti and clientId members (every occurrence; names matched as encoding/json
// matches struct fields, case-insensitively) are strings or null; then the
// last occurrence of each counts, and jti_or_client_id_required when both
// are missing, null or "".
func revokeRequestModel(b []byte) (revokeRequest, *proto.Error) {
	if !json.Valid(b) || !bytes.HasPrefix(bytes.TrimLeft(b, " \t\r\n"), []byte("{")) {
		return revokeRequest{}, &proto.Error{Code: proto.CodeInvalidJSON}
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.Token() // {
	var out revokeRequest
	for dec.More() {
		k, _ := dec.Token()
		var v any
		if err := dec.Decode(&v); err != nil {
			return revokeRequest{}, &proto.Error{Code: proto.CodeInvalidJSON}
		}
		var field *string
		switch key := k.(string); {
		case strings.EqualFold(key, "jti"):
			field = &out.JTI
		case strings.EqualFold(key, "clientId"):
			field = &out.ClientID
		default:
			continue
		}
		switch x := v.(type) {
		case nil:
			*field = ""
		case string:
			*field = x
		default:
			return revokeRequest{}, &proto.Error{Code: proto.CodeInvalidJSON}
		}
	}
	if out.JTI == "" && out.ClientID == "" {
		return revokeRequest{}, &proto.Error{Code: proto.CodeJTIOrClientIDRequired}
	}
	return out, nil
}
