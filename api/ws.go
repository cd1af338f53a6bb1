package api

import (
	"errors"
	"net/http"

	"github.com/relayhq/relay/actors"
	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/transport"
)

// handleWS authenticates the public key before the upgrade (SPEC.md ›
// Authentication rule 1: a bad key gets 401 and never a WebSocket), then hands
// the socket to the transport and its messages to a connection actor.
func (s *Server) handleWS(w http.ResponseWriter, r *http.Request) {
	if s.transport.ShuttingDown() {
		writeError(w, proto.CodeUnavailable)
		return
	}
	raw := r.URL.Query().Get("publicKey")
	if raw == "" {
		writeError(w, proto.CodeUnauthorized)
		return
	}
	k, ok, err := s.keys.Lookup(r.Context(), raw)
	if err != nil {
		s.log.Warn("key lookup failed", "err", err)
		writeError(w, proto.CodeUnavailable)
		return
	}
	if !ok || k.Revoked || k.Type != "public" {
		writeError(w, proto.CodeUnauthorized)
		return
	}
	err = s.transport.Upgrade(w, r, func(c *transport.Conn) transport.Handler {
		return wsSession{s.actors.Open(k.ProjectID, c)}
	})
	switch {
	case errors.Is(err, transport.ErrShuttingDown):
		writeError(w, proto.CodeUnavailable)
	case err != nil:
		// The upgrader has already answered (400 for a non-WebSocket request).
		s.log.Debug("websocket upgrade failed", "err", err)
	}
}

// wsSession adapts an actors.Session to the transport.
type wsSession struct{ *actors.Session }

func (h wsSession) HandleClose(info transport.CloseInfo) {
	status := actors.CloseStatus{}
	if info.ByPeer && info.Code != 1005 { // 1005: the close frame had no status
		status = actors.CloseStatus{Supplied: true, Code: int(info.Code), Reason: info.Reason}
	}
	h.Session.HandleClose(status)
}
