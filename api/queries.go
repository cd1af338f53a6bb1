package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/relayhq/relay/actors"
	"github.com/relayhq/relay/proto"
)

// Server-side queries and actions (proto/PROTOCOL.md › Server-side queries
// and actions): secret key, JSON, beside POST /emit.

// queryTimeout bounds the wait for the actors (and, for a disconnect in a
// cluster, the other members' acks, which have their own bound).
const queryTimeout = 5 * time.Second

// Occupancy pages: limit defaults to 100, at most 1000.
const (
	defaultOccupancyLimit = 100
	maxOccupancyLimit     = 1000
)

// Batch emit: at most maxBatchMessages messages, maxBatchBody bytes in all.
const (
	maxBatchMessages = 100
	maxBatchBody     = 4 << 20
)

func (s *Server) queryRoutes(mux *http.ServeMux) {
	mux.Handle("/channels", methods{http.MethodGet: s.handleOccupancy})
	mux.Handle("/channels/{channel}", methods{http.MethodGet: s.handleChannel})
	mux.Handle("/channels/{channel}/members", methods{http.MethodGet: s.handleMembers})
	mux.Handle("/channels/{channel}/messages", methods{http.MethodGet: s.handleMessages})
	mux.Handle("/clients/{clientId}/disconnect", methods{http.MethodPost: s.handleDisconnect})
	mux.Handle("/emit/batch", methods{http.MethodPost: s.handleEmitBatch})
}

// queryProject is the prologue of every query: the drain gate and the
// secret key.
func (s *Server) queryProject(w http.ResponseWriter, r *http.Request) (string, func(), bool) {
	leave, ok := s.enter(w)
	if !ok {
		return "", nil, false
	}
	projectID, ok := s.secretKeyProject(w, r)
	if !ok {
		leave()
		return "", nil, false
	}
	return projectID, leave, true
}

type occupancyChannel struct {
	Channel         string `json:"channel"`
	SubscriberCount int    `json:"subscriberCount"`
}

type occupancyPage struct {
	Channels   []occupancyChannel `json:"channels"`
	NextCursor *string            `json:"nextCursor"`
}

// handleOccupancy is GET /channels?cursor=&limit=.
func (s *Server) handleOccupancy(w http.ResponseWriter, r *http.Request) {
	projectID, leave, ok := s.queryProject(w, r)
	if !ok {
		return
	}
	defer leave()
	q := r.URL.Query()
	limit := defaultOccupancyLimit
	if v := q.Get("limit"); q.Has("limit") {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxOccupancyLimit {
			writeError(w, proto.CodeInvalidQuery, "param", "limit")
			return
		}
		limit = n
	}
	cursor := q.Get("cursor")
	if cursor != "" && !proto.ValidChannel(cursor) {
		writeError(w, proto.CodeInvalidQuery, "param", "cursor")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	chans, err := s.actors.Occupancy(ctx, projectID)
	if err != nil {
		s.queryFailed(w, projectID, err)
		return
	}
	out := occupancyPage{Channels: []occupancyChannel{}}
	for _, c := range chans {
		if c.Channel <= cursor {
			continue
		}
		if len(out.Channels) == limit {
			next := out.Channels[limit-1].Channel
			out.NextCursor = &next
			break
		}
		out.Channels = append(out.Channels, occupancyChannel{Channel: c.Channel, SubscriberCount: c.Subscribers})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) queryFailed(w http.ResponseWriter, projectID string, err error) {
	s.log.Warn("query not answered", "project", projectID, "err", err)
	writeError(w, proto.CodeUnavailable)
}

// channelQuery runs a query about the path's channel; false when it has
// answered already (a refusal, or a page of channel history).
func (s *Server) channelQuery(w http.ResponseWriter, r *http.Request, kind actors.QueryKind, since uint64) (actors.ChannelAnswer, bool) {
	projectID, leave, ok := s.queryProject(w, r)
	if !ok {
		return actors.ChannelAnswer{}, false
	}
	defer leave()
	channel := r.PathValue("channel")
	if !proto.ValidChannel(channel) {
		writeError(w, proto.CodeInvalidChannel, "channel", channel)
		return actors.ChannelAnswer{}, false
	}
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	if kind == actors.QueryMessages {
		q := r.URL.Query()
		hasSince := q.Has("since")
		if hasSince {
			n, ok := querySince(q.Get("since"))
			if !ok {
				writeError(w, proto.CodeInvalidSince)
				return actors.ChannelAnswer{}, false
			}
			since = n
		}
		if s.historyMessages(ctx, w, r, projectID, channel, hasSince, since) { // a project with channel history (history.go)
			return actors.ChannelAnswer{}, false
		}
	}
	a, err := s.actors.Channel(ctx, projectID, channel, kind, since)
	if err != nil {
		s.queryFailed(w, projectID, err)
		return actors.ChannelAnswer{}, false
	}
	a.Channel = channel
	return a, true
}

// handleChannel is GET /channels/{channel}.
func (s *Server) handleChannel(w http.ResponseWriter, r *http.Request) {
	if a, ok := s.channelQuery(w, r, actors.QueryCount, 0); ok {
		writeJSON(w, http.StatusOK, struct {
			Channel             string `json:"channel"`
			SubscriberCount     int    `json:"subscriberCount"`
			PresenceMemberCount int    `json:"presenceMemberCount"`
		}{a.Channel, a.Subscribers, a.MemberCount})
	}
}

// handleMembers is GET /channels/{channel}/members.
func (s *Server) handleMembers(w http.ResponseWriter, r *http.Request) {
	if a, ok := s.channelQuery(w, r, actors.QueryMembers, 0); ok {
		writeJSON(w, http.StatusOK, struct {
			Channel string   `json:"channel"`
			Members []string `json:"members"`
		}{a.Channel, a.Members})
	}
}

// handleMessages is GET /channels/{channel}/messages?since= (and, with
// channel history, before and limit: history.go).
func (s *Server) handleMessages(w http.ResponseWriter, r *http.Request) {
	if a, ok := s.channelQuery(w, r, actors.QueryMessages, actors.NoSince); ok {
		writeJSON(w, http.StatusOK, struct {
			Channel  string            `json:"channel"`
			Messages []json.RawMessage `json:"messages"`
			Gap      bool              `json:"gap"`
		}{a.Channel, a.Messages, a.Gap})
	}
}

// handleDisconnect is POST /clients/{clientId}/disconnect.
func (s *Server) handleDisconnect(w http.ResponseWriter, r *http.Request) {
	projectID, leave, ok := s.queryProject(w, r)
	if !ok {
		return
	}
	defer leave()
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	clientID := r.PathValue("clientId")
	revoke := wantsTokensRevoked(r)
	// The disconnect first, so that closed counts the sockets it closed
	// (4003); the revocation then closes the user's other sockets (4012),
	// and a reconnect with a token it covers, even one that raced it.
	n, err := s.actors.DisconnectClient(ctx, projectID, clientID)
	if err != nil {
		s.queryFailed(w, projectID, err)
		return
	}
	if revoke {
		if err := s.revokeUserTokens(ctx, projectID, clientID); errors.Is(err, errTooManyRevocations) {
			writeError(w, proto.CodeTooManyRevocations)
			return
		} else if err != nil {
			s.log.Error("revoke a user's tokens", "project", projectID, "err", err)
			writeError(w, proto.CodeUnavailable)
			return
		}
	}
	writeJSON(w, http.StatusOK, struct {
		OK     bool `json:"ok"`
		Closed int  `json:"closed"`
	}{true, n})
}

// wantsTokensRevoked reads a disconnect's body, which SPEC.md ignores:
// channel authorization adds {"revokeTokens":true}. Anything else, a body
// that is not JSON included, asks for nothing.
func wantsTokensRevoked(r *http.Request) bool {
	body, _ := io.ReadAll(io.LimitReader(r.Body, maxControlBody))
	var in struct {
		RevokeTokens bool `json:"revokeTokens"`
	}
	return json.Unmarshal(body, &in) == nil && in.RevokeTokens
}

// revokeUserTokens is a disconnect's revokeTokens: on a project with
// channel authorization on, the user's tokens issued until now are
// refused; elsewhere the body is ignored, as SPEC.md says.
func (s *Server) revokeUserTokens(ctx context.Context, projectID, userID string) error {
	on, known := s.actors.AuthorizationOn(projectID)
	if !known {
		p, err := s.ops.store.Project(ctx, projectID)
		if err != nil {
			return err
		}
		on = p.Authorization
	}
	if !on {
		return nil // the body is ignored there
	}
	return s.ops.revokeUserTokens(ctx, projectID, userID)
}

// handleEmitBatch is POST /emit/batch: each message runs exactly as a POST
// /emit would, in order, and is answered in the same place of results.
func (s *Server) handleEmitBatch(w http.ResponseWriter, r *http.Request) {
	projectID, ok := s.secretKeyProject(w, r)
	if !ok {
		return
	}
	body, ok := readSecretKeyBody(w, r, maxBatchBody)
	if !ok {
		return
	}
	leave, ok := s.enter(w) // once the body is in, as for POST /emit
	if !ok {
		return
	}
	defer leave()
	var in struct {
		Messages []json.RawMessage `json:"messages"`
	}
	if json.Unmarshal(body, &in) != nil || !isJSONObject(body) {
		writeError(w, proto.CodeInvalidJSON)
		return
	}
	if len(in.Messages) == 0 || len(in.Messages) > maxBatchMessages {
		writeError(w, proto.CodeInvalidBatch, "max_messages", maxBatchMessages)
		return
	}
	results := make([]any, 0, len(in.Messages))
	for _, raw := range in.Messages {
		results = append(results, s.emitOne(r.Context(), projectID, raw))
	}
	writeJSON(w, http.StatusOK, map[string]any{"results": results})
}

// emitOne is one message of a batch: its POST /emit answer's body, with ok
// false and the error code when it was refused.
func (s *Server) emitOne(ctx context.Context, projectID string, raw []byte) any {
	start := time.Now()
	defer func() { s.metrics.emitted(time.Since(start)) }()
	req, perr := proto.DecodeEmitRequest(raw)
	if perr != nil {
		out := map[string]any{"ok": false, "error": perr.Code}
		switch perr.Code {
		case proto.CodeInvalidChannel:
			out["channel"] = perr.Channel
		case proto.CodePayloadTooLarge:
			out["max_bytes"] = proto.MaxMessageBytes
		}
		return out
	}
	res, err := s.actors.PublishWithin(ctx, emitTimeout, projectID, req.Channel, req.Payload)
	if err != nil {
		s.log.Warn("emit not answered", "project", projectID, "err", err)
		return map[string]any{"ok": false, "error": proto.CodeUnavailable, "channel": req.Channel}
	}
	switch {
	case res.Err == nil:
		return emitOK{
			OK: true, Channel: req.Channel, Seq: res.Seq, Delivered: res.Delivered, SubscriberCount: res.Subscribers,
			RateLimit: toBudget(res.Channel), ProjectRateLimit: toBudget(res.Project),
		}
	case res.Err.Code == proto.CodeChannelRateLimited || res.Err.Code == proto.CodeProjectRateLimited:
		return map[string]any{"ok": false, "error": res.Err.Code, "channel": req.Channel,
			"rate_limit": toBudget(res.Channel), "project_rate_limit": toBudget(res.Project)}
	default:
		return map[string]any{"ok": false, "error": res.Err.Code, "channel": req.Channel}
	}
}

// querySince reads ?since= as a subscribe's since is read on the socket
// (proto/PROTOCOL.md › subscribe): any decimal number a float64 holds,
// fractions, negatives and exponents included, so that the same since gives
// the same messages and the same gap both ways. The channel compares seqs
// and the ring's low water, whole numbers below 2^53, with it: floor(since)
// answers alike for since ≥ 0, 0 for a negative one (every seq, and the
// ring's low water, is above 0), and 2^53 for a larger one (above every
// seq). Refused, as invalid_since: an empty value, anything but digits, a
// point, a sign and an exponent, and what overflows a float64 (1e400),
// which a socket refuses too.
func querySince(v string) (uint64, bool) {
	if v == "" || strings.Trim(v, "0123456789.eE+-") != "" {
		return 0, false
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	switch {
	case f <= 0:
		return 0, true
	case f >= 1<<53:
		return 1 << 53, true
	}
	return uint64(math.Floor(f)), true
}
