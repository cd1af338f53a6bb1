// Package backend is what a backend needs to use a Relay: emit on a channel,
// mint client-emit tokens for its users, and revoke them. It depends on
// nothing of the server.
package backend

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/lestrrat-go/jwx/v2/jwt"
)

// TokenOptions are what a client-emit token carries (proto/PROTOCOL.md ›
// Client-emit tokens), with the life requested.
type TokenOptions struct {
	Secret    string   // the project's client-emit secret
	ProjectID string   // pid
	Channel   string   // the single channel the token allows
	ClientID  string   // must equal the clientId the connection subscribed with
	Types     []string // message types the token allows
	TTL       time.Duration
	// Now and JTI are for tests; zero values mean the clock and a random id.
	Now time.Time
	JTI string
}

// MintClientEmitToken signs a client-emit token (proto/PROTOCOL.md › Client-emit tokens: JWT,
// HS256 keyed with the secret's UTF-8 bytes). The server caps its life at
// CLIENT_EMIT_TOKEN_MAX_TTL_SECONDS from iat, whatever TTL asks for.
func MintClientEmitToken(o TokenOptions) (string, error) {
	if o.Secret == "" || o.ProjectID == "" || o.Channel == "" || o.ClientID == "" || len(o.Types) == 0 || o.TTL <= 0 {
		return "", errors.New("backend: secret, projectId, channel, clientId, types and a positive TTL are required")
	}
	now := nowOr(o.Now)
	jti := o.JTI
	if jti == "" {
		b := make([]byte, 16)
		rand.Read(b)
		jti = base64.RawURLEncoding.EncodeToString(b)
	}
	return sign(jwt.NewBuilder().
		Claim("pid", o.ProjectID).Claim("ch", o.Channel).Claim("clientId", o.ClientID).Claim("types", o.Types).
		JwtID(jti).IssuedAt(now).Expiration(now.Add(o.TTL)), o.Secret)
}

// RevokeOptions name tokens to revoke: a JTI, every token of a ClientID, or both.
type RevokeOptions struct {
	EmitURL   string // the emit address, …/emit; the revoke address is derived from it
	SecretKey string
	JTI       string
	ClientID  string
	Client    *http.Client // nil: http.DefaultClient
}

// RevokeClientEmitToken calls POST …/emit-tokens/revoke beside EmitURL.
func RevokeClientEmitToken(ctx context.Context, o RevokeOptions) error {
	if o.JTI == "" && o.ClientID == "" {
		return errors.New("backend: a JTI or a ClientID is required")
	}
	url, err := revokeURL(o.EmitURL)
	if err != nil {
		return err
	}
	body := map[string]string{}
	if o.JTI != "" {
		body["jti"] = o.JTI
	}
	if o.ClientID != "" {
		body["clientId"] = o.ClientID
	}
	status, raw, err := post(ctx, o.Client, url, o.SecretKey, body)
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return apiError(status, raw)
	}
	return nil
}

// revokeURL derives the revoke address from the emit address: same host,
// path …/emit-tokens/revoke in place of …/emit.
func revokeURL(emitURL string) (string, error) {
	base, ok := strings.CutSuffix(strings.TrimRight(emitURL, "/"), "/emit")
	if !ok {
		return "", fmt.Errorf("backend: emit URL %q does not end in /emit", emitURL)
	}
	return base + "/emit-tokens/revoke", nil
}

// Budget is one rate-limit window: {limit, remaining, resetAt}.
type Budget struct {
	Limit     int       `json:"limit"`
	Remaining int       `json:"remaining"`
	ResetAt   time.Time `json:"resetAt"`
}

// EmitResult is the parsed 200 or 429 body of POST /emit. RateLimited is
// true for a 429, with Error naming which budget ran out.
type EmitResult struct {
	OK               bool   `json:"ok"`
	Channel          string `json:"channel"`
	Seq              uint64 `json:"seq"`
	Delivered        int    `json:"delivered"`
	SubscriberCount  int    `json:"subscriberCount"`
	Error            string `json:"error"`
	RateLimit        Budget `json:"rate_limit"`
	ProjectRateLimit Budget `json:"project_rate_limit"`
	RateLimited      bool   `json:"-"`
}

// Error is any other answer of the service: its HTTP status and error code.
type Error struct {
	Status int
	Code   string
	Body   string
}

func (e *Error) Error() string { return fmt.Sprintf("relay: %d %s", e.Status, e.Code) }

func apiError(status int, raw []byte) error {
	var b struct {
		Error string `json:"error"`
	}
	json.Unmarshal(raw, &b)
	return &Error{Status: status, Code: b.Error, Body: string(raw)}
}

// Emit posts payload (any JSON-marshalable value, or json.RawMessage) on
// channel. A 429 is a result, not an error, so the caller sees the budgets.
func Emit(ctx context.Context, client *http.Client, emitURL, secretKey, channel string, payload any) (EmitResult, error) {
	status, raw, err := post(ctx, client, emitURL, secretKey, map[string]any{"channel": channel, "payload": payload})
	if err != nil {
		return EmitResult{}, err
	}
	if status != http.StatusOK && status != http.StatusTooManyRequests {
		return EmitResult{}, apiError(status, raw)
	}
	var r EmitResult
	if err := json.Unmarshal(raw, &r); err != nil {
		return EmitResult{}, fmt.Errorf("relay: unreadable emit answer: %w", err)
	}
	r.RateLimited = status == http.StatusTooManyRequests
	return r, nil
}

func post(ctx context.Context, client *http.Client, url, secretKey string, body any) (int, []byte, error) {
	if client == nil {
		client = http.DefaultClient
	}
	b, err := json.Marshal(body)
	if err != nil {
		return 0, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+secretKey)
	res, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	return res.StatusCode, raw, err
}
