package api

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/relayhq/relay/actors"
	"github.com/relayhq/relay/proto"
)

// budgetBody is {limit, remaining, resetAt} (proto/PROTOCOL.md › POST /emit).
type budgetBody struct {
	Limit     int    `json:"limit"`
	Remaining int    `json:"remaining"`
	ResetAt   string `json:"resetAt"`
}

func toBudget(b actors.Budget) budgetBody {
	return budgetBody{Limit: b.Limit, Remaining: b.Remaining, ResetAt: timestamp(b.ResetAt)}
}

type emitOK struct {
	OK               bool       `json:"ok"`
	Channel          string     `json:"channel"`
	Seq              uint64     `json:"seq"`
	Delivered        int        `json:"delivered"`
	SubscriberCount  int        `json:"subscriberCount"`
	RateLimit        budgetBody `json:"rate_limit"`
	ProjectRateLimit budgetBody `json:"project_rate_limit"`
}

type emitLimited struct {
	Error            proto.Code `json:"error"`
	RateLimit        budgetBody `json:"rate_limit"`
	ProjectRateLimit budgetBody `json:"project_rate_limit"`
}

// emitTimeout bounds the wait for the actors; they answer in microseconds
// unless the process is overloaded.
const emitTimeout = 5 * time.Second

// handleEmit is POST /emit (proto/PROTOCOL.md › POST /emit).
func (s *Server) handleEmit(w http.ResponseWriter, r *http.Request) {
	projectID, ok := s.secretKeyProject(w, r)
	if !ok {
		return
	}
	start := time.Now()
	defer func() { s.metrics.emitted(time.Since(start)) }()
	buf, err := readPooledBody(w, r, maxEmitBody)
	defer putPooledBody(buf) // deferred: the decoded request owns copies, never these bytes
	body := buf.Bytes()
	if errors.Is(err, errBodyTooLarge) {
		// Far over the message cap whatever its shape.
		writeError(w, proto.CodePayloadTooLarge, "max_bytes", proto.MaxMessageBytes)
		return
	}
	if err != nil {
		writeError(w, proto.CodeInvalidJSON)
		return
	}
	req, perr := proto.DecodeEmitRequest(body)
	if perr != nil {
		writeSpecError(w, perr)
		return
	}
	// The drain gate once the body is in: a shutdown waits for the emits it
	// admitted, not for an upload still under way (which then gets 503).
	leave, ok := s.enter(w)
	if !ok {
		return
	}
	defer leave()
	res, err := s.actors.PublishWithin(r.Context(), emitTimeout, projectID, req.Channel, req.Payload)
	if err != nil {
		s.log.Warn("emit not answered", "project", projectID, "err", err)
		writeError(w, proto.CodeUnavailable)
		return
	}
	switch {
	case res.Err == nil:
	case res.Err.Code == proto.CodeChannelRateLimited || res.Err.Code == proto.CodeProjectRateLimited:
		// The budgets' 429 carries both windows.
		writeJSON(w, http.StatusTooManyRequests, emitLimited{
			Error: res.Err.Code, RateLimit: toBudget(res.Channel), ProjectRateLimit: toBudget(res.Project),
		})
		return
	default: // service_unavailable (settings not loaded), too_many_channels, …: the code's own status
		writeError(w, res.Err.Code)
		return
	}
	// By hand: encoding/json's reflection was a tenth of an emit's CPU.
	// TestAppendEmitOK holds it to what json.Marshal makes of emitOK.
	// The body's buffer is free again: the request holds copies.
	buf.Reset()
	out := appendEmitOK(buf.AvailableBuffer(), req.Channel, res)
	h := w.Header()
	h["Content-Type"] = jsonContentType
	h["Cache-Control"] = noStore
	h["Date"] = s.date.at(time.Now()) // now, not start: an emit may wait while its project loads
	// No Content-Length: net/http counts the body, which it holds whole when
	// the handler returns, without a string and a header entry per emit.
	w.WriteHeader(http.StatusOK)
	w.Write(out)
}

// httpDate is the Date header of the current second, shared by the 200s of
// POST /emit answered in it: net/http formats one for every response that
// has none, which was a fiftieth of an emit's CPU.
type httpDate struct{ cur atomic.Pointer[dateHeader] }

type dateHeader struct {
	unix  int64
	value []string
}

// at returns the header value for now's second.
func (d *httpDate) at(now time.Time) []string {
	sec := now.Unix()
	if c := d.cur.Load(); c != nil && c.unix == sec {
		return c.value
	}
	c := &dateHeader{unix: sec, value: []string{now.UTC().Format(http.TimeFormat)}}
	d.cur.Store(c)
	return c.value
}

// Header values shared by every answer (net/http copies them before writing).
var (
	jsonContentType = []string{"application/json"}
	noStore         = []string{"no-store"}
)

// appendEmitOK appends the 200 body of POST /emit: emitOK as json.Marshal
// writes it, plus the newline json.Encoder ends with. Channel names need no
// escaping (ValidChannel).
func appendEmitOK(dst []byte, channel string, res actors.PublishResult) []byte {
	dst = append(dst, `{"ok":true,"channel":"`...)
	dst = append(dst, channel...)
	dst = append(dst, `","seq":`...)
	dst = strconv.AppendUint(dst, res.Seq, 10)
	dst = append(dst, `,"delivered":`...)
	dst = strconv.AppendInt(dst, int64(res.Delivered), 10)
	dst = append(dst, `,"subscriberCount":`...)
	dst = strconv.AppendInt(dst, int64(res.Subscribers), 10)
	dst = append(dst, `,"rate_limit":`...)
	dst = appendBudget(dst, res.Channel)
	dst = append(dst, `,"project_rate_limit":`...)
	dst = appendBudget(dst, res.Project)
	return append(dst, "}\n"...)
}

func appendBudget(dst []byte, b actors.Budget) []byte {
	dst = append(dst, `{"limit":`...)
	dst = strconv.AppendInt(dst, int64(b.Limit), 10)
	dst = append(dst, `,"remaining":`...)
	dst = strconv.AppendInt(dst, int64(b.Remaining), 10)
	dst = append(dst, `,"resetAt":"`...)
	dst = appendTimestamp(dst, b.ResetAt)
	return append(dst, `"}`...)
}

// appendTimestamp appends t as timestampLayout does (UTC, milliseconds),
// digit by digit: the layout interpreter was a thirtieth of an emit's CPU.
// TestAppendTimestamp holds the two to the same text.
func appendTimestamp(dst []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	hour, minute, second := t.Clock()
	if year < 0 || year > 9999 {
		return t.AppendFormat(dst, timestampLayout)
	}
	dst = appendDigits(dst, year, 4)
	dst = append(dst, '-')
	dst = appendDigits(dst, int(month), 2)
	dst = append(dst, '-')
	dst = appendDigits(dst, day, 2)
	dst = append(dst, 'T')
	dst = appendDigits(dst, hour, 2)
	dst = append(dst, ':')
	dst = appendDigits(dst, minute, 2)
	dst = append(dst, ':')
	dst = appendDigits(dst, second, 2)
	dst = append(dst, '.')
	dst = appendDigits(dst, t.Nanosecond()/int(time.Millisecond), 3)
	return append(dst, 'Z')
}

// appendDigits appends n (0 <= n < 10^width) zero-padded to width digits.
func appendDigits(dst []byte, n, width int) []byte {
	var b [4]byte
	for i := width - 1; i >= 0; i-- {
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return append(dst, b[:width]...)
}

// writeSpecError writes a proto.Error with the fields its code carries.
func writeSpecError(w http.ResponseWriter, e *proto.Error) {
	switch e.Code {
	case proto.CodeInvalidChannel:
		writeError(w, e.Code, "channel", e.Channel)
	case proto.CodePayloadTooLarge:
		writeError(w, e.Code, "max_bytes", proto.MaxMessageBytes)
	default:
		writeError(w, e.Code)
	}
}

// secretKeyProject authenticates Authorization: Bearer <SECRET_KEY> and
// returns the key's project, or answers 401 (or 503 when the store is down
// and the key is not cached).
func (s *Server) secretKeyProject(w http.ResponseWriter, r *http.Request) (string, bool) {
	auth := r.Header.Get("Authorization")
	if strings.TrimSpace(auth) == "" {
		writeError(w, proto.CodeMissingSecretKey)
		return "", false
	}
	scheme, raw, _ := strings.Cut(strings.TrimSpace(auth), " ")
	raw = strings.TrimSpace(raw)
	if !strings.EqualFold(scheme, "Bearer") || raw == "" {
		writeError(w, proto.CodeInvalidSecretKey)
		return "", false
	}
	k, ok, err := s.keys.Lookup(r.Context(), raw)
	if err != nil {
		s.log.Warn("key lookup failed", "err", err)
		writeError(w, proto.CodeUnavailable)
		return "", false
	}
	if !ok || k.Revoked || k.Type != "secret" {
		writeError(w, proto.CodeInvalidSecretKey)
		return "", false
	}
	s.keys.used(k) // an atomic load; the store hears of it within a minute
	return k.ProjectID, true
}
