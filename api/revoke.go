package api

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/relayhq/relay/proto"
)

// handleRevokeTokens is POST /emit-tokens/revoke (proto/PROTOCOL.md). The
// revocation is stored before the answer (it survives a restart) and applied
// to the live project at once (projectOps.revokeTokens).
func (s *Server) handleRevokeTokens(w http.ResponseWriter, r *http.Request) {
	projectID, ok := s.secretKeyProject(w, r)
	if !ok {
		return
	}
	if ok, retry := s.revokesPerProject.take(projectID); !ok {
		writeThrottled(w, retry)
		return
	}
	body, ok := readSecretKeyBody(w, r, maxControlBody)
	if !ok {
		return
	}
	in, perr := decodeRevokeRequest(body)
	if perr != nil {
		writeError(w, perr.Code)
		return
	}
	leave, ok := s.enter(w) // once the body is in, as for POST /emit
	if !ok {
		return
	}
	defer leave()
	if err := s.ops.revokeTokens(r.Context(), projectID, in); errors.Is(err, errTooManyRevocations) {
		writeError(w, proto.CodeTooManyRevocations)
		return
	} else if err != nil {
		s.log.Error("revoke tokens", "project", projectID, "err", err)
		writeError(w, proto.CodeUnavailable)
		return
	}
	writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
}

// revokeRequest is a decoded revoke body; an empty field was absent, null or "".
type revokeRequest struct {
	JTI      string
	ClientID string
}

// decodeRevokeRequest parses {jti?, clientId?} in proto/PROTOCOL.md's order of checks:
// invalid_json (not a JSON object, or jti or clientId present and neither a
// string nor null), then jti_or_client_id_required (neither is a non-empty
// string). An accepted request has at least one field set.
func decodeRevokeRequest(body []byte) (revokeRequest, *proto.Error) {
	var in struct {
		JTI      *string `json:"jti"`
		ClientID *string `json:"clientId"`
	}
	if json.Unmarshal(body, &in) != nil || !isJSONObject(body) {
		return revokeRequest{}, &proto.Error{Code: proto.CodeInvalidJSON}
	}
	var out revokeRequest
	if in.JTI != nil {
		out.JTI = *in.JTI
	}
	if in.ClientID != nil {
		out.ClientID = *in.ClientID
	}
	if out.JTI == "" && out.ClientID == "" {
		return revokeRequest{}, &proto.Error{Code: proto.CodeJTIOrClientIDRequired}
	}
	return out, nil
}

func isJSONObject(b []byte) bool {
	for _, c := range b {
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		}
		return c == '{'
	}
	return false
}
