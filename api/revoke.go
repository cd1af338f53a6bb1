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
	var in struct {
		JTI      *string `json:"jti"`
		ClientID *string `json:"clientId"`
	}
	if err != nil || json.Unmarshal(body, &in) != nil || !isJSONObject(body) {
		writeError(w, proto.CodeInvalidJSON)
		return
	}
	now := s.now().UTC()
	// A token revoked now expires by now + the maximum TTL at the latest.
	expires := now.Add(s.tokenTTL + time.Minute)
	var revs []actors.Revocation
	if in.JTI != nil && *in.JTI != "" {
		revs = append(revs, actors.Revocation{Kind: actors.RevokeJTI, Value: *in.JTI, RevokedAt: now, ExpiresAt: expires})
	}
	if in.ClientID != nil && *in.ClientID != "" {
		revs = append(revs, actors.Revocation{Kind: actors.RevokeClient, Value: *in.ClientID, RevokedAt: now, ExpiresAt: expires})
	}
	if len(revs) == 0 {
		writeError(w, proto.CodeJTIOrClientIDRequired)
		return
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
