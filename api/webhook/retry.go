package webhook

import (
	"errors"
	"net"
	"net/url"
	"strconv"
	"time"
)

// Retries (api/README.md › Webhooks and usage): a failed attempt is retried when
// it may succeed later — no answer (connection refused or reset, DNS, the
// timeout) or an answer 408, 429 or 5xx — and not when the receiver refused
// the event itself (any other 4xx, or a 3xx: redirects are not followed) nor
// when the guard refused the target. Retry n waits RetryBase·2^(n-1), at
// most RetryMaxDelay, less a random part of up to half (so that the retries
// of many events that failed together spread out), or the receiver's
// Retry-After if longer (still at most RetryMaxDelay); there are at most
// MaxAttempts attempts, none starting later than RetryFor after the first.

// retryableStatus reports whether an answer with status may be retried.
func retryableStatus(status int) bool {
	return status == 408 || status == 429 || status >= 500
}

// retryAfter reads a Retry-After header in seconds (its date form is
// ignored); 0 when absent or unreadable.
func retryAfter(h string) time.Duration {
	n, err := strconv.Atoi(h)
	if err != nil || n <= 0 {
		return 0
	}
	return time.Duration(min(n, 3600)) * time.Second
}

// retryDelay is how long j waits before its next attempt, and false when it
// is not retried: the failure is final, its attempts or its time are used
// up, or the dispatcher is closing. Called with mu held (for d.ids).
func (d *Dispatcher) retryDelay(j *job, res result, now time.Time) (time.Duration, bool) {
	if !res.retryable || d.closed || j.attempt >= d.cfg.MaxAttempts {
		return 0, false
	}
	delay := d.cfg.RetryMaxDelay
	if shift := j.attempt - 1; shift < 30 && d.cfg.RetryBase<<shift < delay {
		delay = d.cfg.RetryBase << shift
	}
	delay -= time.Duration(d.ids.Uint64() % uint64(delay/2+1)) // jitter: up to half off
	if res.retryAfter > delay {
		delay = min(res.retryAfter, d.cfg.RetryMaxDelay)
	}
	if now.Add(delay).Sub(j.first) > d.cfg.RetryFor {
		return 0, false
	}
	return delay, true
}

// refusedPrivate is the error shown for a target the guard refused.
const refusedPrivate = "refused: the URL leads to a loopback, private or otherwise non-public address (WEBHOOK_ALLOW_PRIVATE_ADDRESSES)"

// maxErrorText bounds the error text a record keeps.
const maxErrorText = 300

// attemptError says in a few words why an attempt got no answer, without
// the URL (the project's own, but its query string may hold a token).
func attemptError(err error, timeout time.Duration) string {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout: no answer within " + timeout.String()
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	s := err.Error()
	if len(s) > maxErrorText {
		s = s[:maxErrorText]
	}
	return s
}

// refusalLog is the rate limit of one project's refusal log lines: one a
// minute, and the number left out since the last one.
type refusalLog struct {
	last       time.Time
	suppressed int64
}

// refusalEvery is how often a project's refusals are logged at most.
const refusalEvery = time.Minute

// refusal counts a refused delivery of project in its rate limit and
// returns the log line to write, if it is time for one. Called with mu held.
func (d *Dispatcher) refusal(project, rawURL, why string, now time.Time) func() {
	r := d.refusals[project]
	if r != nil && now.Sub(r.last) < refusalEvery {
		r.suppressed++
		return nil
	}
	if r == nil {
		if len(d.refusals) >= 10000 { // forget the quiet ones
			for id, old := range d.refusals {
				if now.Sub(old.last) >= refusalEvery {
					delete(d.refusals, id)
				}
			}
		}
		r = &refusalLog{}
		d.refusals[project] = r
	}
	suppressed := r.suppressed
	r.last, r.suppressed = now, 0
	url := RedactURL(rawURL)
	return func() {
		d.log.Warn("webhook refused before sending: its URL is not allowed", "project", project, "url", url, "reason", why,
			"suppressed", suppressed, "every", refusalEvery)
	}
}
