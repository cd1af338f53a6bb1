package api

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"

	"github.com/relayhq/relay/actors"
	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/transport"
)

// handleWS authenticates the public key before the upgrade (proto/PROTOCOL.md ›
// Connecting: a bad key gets 401 and never a WebSocket), then hands
// the socket to the transport and its messages to a connection actor.
func (s *Server) handleWS(w http.ResponseWriter, r *http.Request) {
	leave, ok := s.enter(w)
	if !ok {
		s.metrics.refused(refusedShuttingDown)
		return
	}
	defer leave()
	q := r.URL.Query() // parsed once: the token may be long
	raw := q.Get("publicKey")
	if raw == "" {
		s.metrics.refused(refusedMissingKey)
		writeError(w, proto.CodeUnauthorized)
		return
	}
	k, ok, err := s.keys.Lookup(r.Context(), raw)
	if err != nil {
		s.log.Warn("key lookup failed", "err", err)
		s.metrics.refused(refusedStoreDown)
		writeError(w, proto.CodeUnavailable)
		return
	}
	switch {
	case !ok:
		s.metrics.refused(refusedUnknownKey)
	case k.Revoked:
		s.metrics.refused(refusedRevokedKey)
	case k.Type != "public":
		s.metrics.refused(refusedNotPublic)
	}
	if !ok || k.Revoked || k.Type != "public" {
		writeError(w, proto.CodeUnauthorized)
		return
	}
	s.keys.used(k) // an atomic load; the store hears of it within a minute
	// Channel authorization (PROTOCOL.md): a project that has not turned
	// it on ignores token, as it ignores any other parameter.
	var ident *actors.Identity
	if raw := q.Get("token"); raw != "" && k.Authz != nil && k.Authz.On {
		var err error
		if ident, err = s.actors.VerifyConnectionToken(r.Context(), raw, k.Authz, s.now()); err != nil {
			s.metrics.refused(refusedBadToken)
			code := proto.CodeInvalidToken
			if errors.Is(err, actors.ErrTokenExpired) {
				code = proto.CodeTokenExpired
			}
			writeError(w, code)
			return
		}
	}

	ip := s.clientAddr(r) // parsed once: X-Forwarded-For may be long
	addr := addrForLog(ip, r)
	lease, ok := s.actors.Reserve(k.ProjectID, addrKey(ip))
	if !ok {
		s.metrics.refused(refusedTooMany)
		writeError(w, proto.CodeTooManyConnections)
		return
	}
	if !isWebSocketUpgrade(r) {
		// A plain GET (a browser's address bar, curl): say what this is, in
		// words, rather than let the upgrader answer "bad Upgrade header".
		// After the key and connection checks, whose answers are the same
		// for every request (proto/PROTOCOL.md › Connecting).
		s.actors.Release(lease)
		s.metrics.refused(refusedBadUpgrade)
		writeNotWebSocket(w)
		return
	}
	opened := false
	var conn *transport.Conn
	err = s.transport.Upgrade(w, r, func(c *transport.Conn) transport.Handler {
		opened, conn = true, c
		// The client address is logged here, once: the transport's
		// "connection closed" line names the same conn.
		if s.log.Enabled(r.Context(), slog.LevelDebug) {
			s.log.Debug("connection opened", "conn", c.ID(), "project", k.ProjectID, "addr", addr)
		}
		return wsSession{s.actors.OpenAuthorized(lease, k.Hash, c, k.Authz, ident)}
	})
	if !opened {
		s.actors.Release(lease)
	}
	if err == nil {
		s.recheckKey(r, raw, conn)
	}
	switch {
	case errors.Is(err, transport.ErrShuttingDown):
		s.metrics.refused(refusedShuttingDown)
		writeError(w, proto.CodeUnavailable)
	case err != nil:
		s.metrics.refused(refusedBadUpgrade)
		// The upgrader has already answered (400 for a non-WebSocket request).
		s.log.Debug("websocket upgrade failed", "addr", addr, "err", err)
	}
}

// recheckKey closes a socket whose key was revoked (or rotated, or its
// overlap window ended) while it was being opened. A revocation clears the
// key cache and then tells the project actor to close that key's sockets;
// a handshake that checked the key before the revocation but registered its
// socket with the actor after that message would be missed, and would stay
// open on a dead key. Looked up again once the socket is registered, the key
// is seen revoked in every such case.
func (s *Server) recheckKey(r *http.Request, raw string, c *transport.Conn) {
	// Not found: the project was deleted meanwhile, and its actor closes the
	// socket 4004 (a project actor that finds its project missing closes
	// every socket it is given). The store down: the revocation's own close
	// is the answer then.
	if k, ok, err := s.keys.Lookup(r.Context(), raw); err == nil && ok && k.Revoked {
		c.Close(proto.CloseKeyRevoked, "key revoked")
	}
}

// notWebSocket is the body of a GET /ws that asks for no WebSocket upgrade.
const notWebSocket = "GET /ws is Relay's WebSocket endpoint: connect to it with a WebSocket client " +
	"(a request with Upgrade: websocket), e.g. new WebSocket(\"ws://HOST/ws?publicKey=pk_live_…\") " +
	"or the browser client at /client.js. The protocol is described in proto/PROTOCOL.md.\n"

// isWebSocketUpgrade: the request asks for a WebSocket (its Upgrade header
// names websocket). Whether the rest of the handshake is right is the
// upgrader's to answer (400, or 426 for an unknown version).
func isWebSocketUpgrade(r *http.Request) bool {
	for _, v := range r.Header.Values("Upgrade") {
		for _, tok := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "websocket") {
				return true
			}
		}
	}
	return false
}

// writeNotWebSocket answers 400 in plain text and closes the connection, as
// the upgrader does with a bad handshake.
func writeNotWebSocket(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Connection", "close")
	w.WriteHeader(http.StatusBadRequest)
	io.WriteString(w, notWebSocket)
}

// wsSession adapts an actors.Session to the transport.
type wsSession struct{ *actors.Session }

func (h wsSession) HandleClose(info transport.CloseInfo) {
	if info.Cause == transport.CauseSlowConsumer {
		h.Session.ClosedSlow()
	}
	status := actors.CloseStatus{}
	if info.ByPeer && info.Code != 1005 { // 1005: the close frame had no status
		status = actors.CloseStatus{Supplied: true, Code: int(info.Code), Reason: info.Reason}
	}
	h.Session.HandleClose(status)
}
