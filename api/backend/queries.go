package backend

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// Server is the server-side query and action API (proto/PROTOCOL.md ›
// Server-side queries and actions) on the host of EmitURL, with the
// project's secret key.
type Server struct {
	EmitURL   string // …/emit; the other addresses are derived from it
	SecretKey string
	Client    *http.Client // nil: http.DefaultClient
}

// ChannelCount is one channel of an occupancy page.
type ChannelCount struct {
	Channel         string `json:"channel"`
	SubscriberCount int    `json:"subscriberCount"`
}

// ChannelPage is GET /channels: NextCursor is "" on the last page.
type ChannelPage struct {
	Channels   []ChannelCount `json:"channels"`
	NextCursor string         `json:"nextCursor"`
}

// ChannelState is GET /channels/{channel}.
type ChannelState struct {
	Channel             string `json:"channel"`
	SubscriberCount     int    `json:"subscriberCount"`
	PresenceMemberCount int    `json:"presenceMemberCount"`
}

// History is GET /channels/{channel}/messages: each message as subscribers
// got it ({channel, payload, seq}, plus clientId and type for a client
// emit), oldest first. Gap is true when some of what followed since is no
// longer buffered (or stored). More, on a project with channel history,
// is true when the page was cut at its limit: ask again with Since = its
// last seq, or Before = its first.
type History struct {
	Channel  string            `json:"channel"`
	Messages []json.RawMessage `json:"messages"`
	Gap      bool              `json:"gap"`
	More     bool              `json:"more"`
}

// HistoryPage pages a project's stored channel history (api/README.md ›
// Channel history): Since alone pages forwards (the oldest Limit after
// it), Before alone backwards (the newest Limit below it, for scroll-back),
// both between them, neither the newest Limit. Limit 0 is the server's
// default (100); at most 1000.
type HistoryPage struct {
	Since, Before *uint64
	Limit         int
}

// BatchMessage is one message of EmitBatch.
type BatchMessage struct {
	Channel string `json:"channel"`
	Payload any    `json:"payload"`
}

// BatchResult is one message's answer: OK with Seq and Delivered, or Error
// (and, when a budget ran out, both budgets).
type BatchResult struct {
	EmitResult
	MaxBytes int `json:"max_bytes,omitempty"`
}

func (s Server) base() (string, error) {
	base, ok := strings.CutSuffix(strings.TrimRight(s.EmitURL, "/"), "/emit")
	if !ok {
		return "", fmt.Errorf("backend: emit URL %q does not end in /emit", s.EmitURL)
	}
	return base, nil
}

// call sends method path with body (nil: none) and decodes a 200 into out.
func (s Server) call(ctx context.Context, method, path string, body any, out any) error {
	base, err := s.base()
	if err != nil {
		return err
	}
	var status int
	var raw []byte
	if body != nil {
		status, raw, err = post(ctx, s.Client, base+path, s.SecretKey, body)
	} else {
		status, raw, err = s.send(ctx, method, base+path)
	}
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return apiError(status, raw)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("relay: unreadable answer: %w", err)
	}
	return nil
}

func (s Server) send(ctx context.Context, method, u string) (int, []byte, error) {
	client := s.Client
	if client == nil {
		client = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+s.SecretKey)
	res, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	return res.StatusCode, raw, err
}

// Channels is one page of the project's channels that have subscribers
// (GET /channels); cursor "" starts, limit 0 is the server's default (100).
func (s Server) Channels(ctx context.Context, cursor string, limit int) (ChannelPage, error) {
	q := url.Values{}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	path := "/channels"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var p struct {
		Channels   []ChannelCount `json:"channels"`
		NextCursor *string        `json:"nextCursor"`
	}
	if err := s.call(ctx, http.MethodGet, path, nil, &p); err != nil {
		return ChannelPage{}, err
	}
	out := ChannelPage{Channels: p.Channels}
	if p.NextCursor != nil {
		out.NextCursor = *p.NextCursor
	}
	return out, nil
}

// Channel is one channel's subscriber and presence member counts.
func (s Server) Channel(ctx context.Context, channel string) (ChannelState, error) {
	var out ChannelState
	err := s.call(ctx, http.MethodGet, "/channels/"+url.PathEscape(channel), nil, &out)
	return out, err
}

// Members is the channel's presence clientIds, sorted.
func (s Server) Members(ctx context.Context, channel string) ([]string, error) {
	var out struct {
		Members []string `json:"members"`
	}
	err := s.call(ctx, http.MethodGet, "/channels/"+url.PathEscape(channel)+"/members", nil, &out)
	return out.Members, err
}

// Messages is what the channel's replay ring holds after seq since (0: all).
func (s Server) Messages(ctx context.Context, channel string, since uint64) (History, error) {
	path := "/channels/" + url.PathEscape(channel) + "/messages"
	if since > 0 {
		path += "?since=" + strconv.FormatUint(since, 10)
	}
	var out History
	err := s.call(ctx, http.MethodGet, path, nil, &out)
	return out, err
}

// MessagesPage is Messages with the store's paging, for a project with
// channel history (without it: what the replay ring holds).
func (s Server) MessagesPage(ctx context.Context, channel string, p HistoryPage) (History, error) {
	q := url.Values{}
	if p.Since != nil {
		q.Set("since", strconv.FormatUint(*p.Since, 10))
	}
	if p.Before != nil {
		q.Set("before", strconv.FormatUint(*p.Before, 10))
	}
	if p.Limit != 0 {
		q.Set("limit", strconv.Itoa(p.Limit))
	}
	path := "/channels/" + url.PathEscape(channel) + "/messages"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out History
	err := s.call(ctx, http.MethodGet, path, nil, &out)
	return out, err
}

// DisconnectClient closes every socket of clientID (close code 4003) on
// every node and returns how many were closed.
func (s Server) DisconnectClient(ctx context.Context, clientID string) (int, error) {
	var out struct {
		Closed int `json:"closed"`
	}
	err := s.call(ctx, http.MethodPost, "/clients/"+url.PathEscape(clientID)+"/disconnect", struct{}{}, &out)
	return out.Closed, err
}

// EmitBatch emits up to 100 messages in one request; each has its own
// result, in order (a refused one is a result, not an error).
func (s Server) EmitBatch(ctx context.Context, msgs []BatchMessage) ([]BatchResult, error) {
	var out struct {
		Results []BatchResult `json:"results"`
	}
	if err := s.call(ctx, http.MethodPost, "/emit/batch", map[string]any{"messages": msgs}, &out); err != nil {
		return nil, err
	}
	for i := range out.Results {
		r := &out.Results[i]
		r.RateLimited = r.Error == "channel_rate_limited" || r.Error == "project_rate_limited"
	}
	return out.Results, nil
}
