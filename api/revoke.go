package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/relayhq/relay/actors"
	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/store"
)

// handleRevokeTokens is SPEC.md › Client-emit token revoke endpoint. The
// revocation is stored before the answer (it survives a restart) and applied
// to the live project at once.
func (s *Server) handleRevokeTokens(w http.ResponseWriter, r *http.Request) {
	leave, ok := s.enter(w)
	if !ok {
		return
	}
	defer leave()
	projectID, ok := s.secretKeyProject(w, r)
	if !ok {
		return
	}
	body, err := readBody(w, r, maxControlBody)
	if errors.Is(err, errBodyTooLarge) {
		writeError(w, proto.CodeBodyTooLarge, "max_bytes", maxControlBody)
		return
	}
	if err != nil {
		writeError(w, proto.CodeInvalidJSON)
		return
	}
	in, perr := decodeRevokeRequest(body)
	if perr != nil {
		writeError(w, perr.Code)
		return
	}
	now := s.now().UTC()
	// A token revoked now expires by now + the maximum TTL at the latest.
	expires := now.Add(s.tokenTTL + time.Minute)
	var revs []actors.Revocation
	if in.JTI != "" {
		revs = append(revs, actors.Revocation{Kind: actors.RevokeJTI, Value: in.JTI, RevokedAt: now, ExpiresAt: expires})
	}
	if in.ClientID != "" {
		revs = append(revs, actors.Revocation{Kind: actors.RevokeClient, Value: in.ClientID, RevokedAt: now, ExpiresAt: expires})
	}
	for _, rv := range revs {
		err := s.store.AddRevocation(r.Context(), store.Revocation{
			ProjectID: projectID, Kind: rv.Kind, Value: rv.Value, RevokedAt: rv.RevokedAt, ExpiresAt: rv.ExpiresAt,
		})
		if err != nil {
			s.log.Error("store revocation", "project", projectID, "err", err)
			writeError(w, proto.CodeUnavailable)
			return
		}
	}
	s.actors.Revoke(projectID, revs)
	writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
}

// revokeRequest is a decoded revoke body; an empty field was absent, null or "".
type revokeRequest struct {
	JTI      string
	ClientID string
}

// decodeRevokeRequest parses {jti?, clientId?} in SPEC.md's order of checks:
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
