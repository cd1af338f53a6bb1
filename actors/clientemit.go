package actors

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/relayhq/relay/proto"
)

// clientEmit applies the client-emit rules 1–7 in order; the channel
// actor does the rest (channel budget, seq, fan-out to the others, emit ack).
// Every refusal is an error frame to the emitter naming the channel.
func (a *projectActor) clientEmit(ctx actor.Context, m *clientEmit) {
	msg := &m.msg
	fail := func(code proto.Code) { a.refuseClientEmitInOrder(ctx, m, code) }
	now := a.cfg.Now()

	if a.settings.ClientEmitSecret == "" { // 1
		fail(proto.CodeClientEmitNotConfigured)
		return
	}
	if msg.Token == "" || msg.Type == "" { // 2
		fail(proto.CodeTokenAndTypeRequired)
		return
	}
	claims, ok := verifyEmitToken(msg.Token, a.settings.ClientEmitSecret, a.id, msg.Channel, msg.Type, now, a.cfg.TokenMaxTTL)
	if !ok { // 3
		fail(proto.CodeInvalidEmitToken)
		return
	}
	if !m.presence || m.subClientID != claims.clientID { // 4
		fail(proto.CodeEmitIdentityMismatch)
		return
	}
	if a.isRevoked(claims, now) { // 5
		fail(proto.CodeEmitTokenRevoked)
		return
	}
	// Rule 6 counts the whole cluster: ask the project grain, unless this
	// node holds the clientId's window (then the hold counts it).
	var ok6 bool
	if a.budgets != nil {
		h := a.heldWindow(ctx, claims.clientID, m.sink, now)
		if h == nil {
			a.askClientWindow(ctx, m, claims.clientID)
			return
		}
		ok6 = h.take(now, a.cfg.ClientEmitRatePerSecond)
	} else {
		ok6 = a.clientWindows.take(claims.clientID, now, a.cfg.ClientEmitRatePerSecond)
	}
	if !ok6 { // 6
		a.cfg.counters.RateLimitedClient.Add(1)
		a.usage.health.add(hLimitedClient, 1, now.UnixNano())
		fail(proto.CodeClientEmitRateLimited)
		return
	}
	if msg.PayloadErr != nil { // 7: size (measured at the edge, as for POST /emit), then the budgets
		fail(msg.PayloadErr.Code)
		return
	}
	a.publish(ctx, a.clientPublish(m, claims.clientID, now)) // project backstop here, channel budget and rule 8 in the channel actor
}

// clientPublish is the emit a client emit that passed rules 1–7 becomes.
func (a *projectActor) clientPublish(m *clientEmit, clientID string, at time.Time) *Publish {
	p := &Publish{Channel: m.msg.Channel, Payload: m.msg.Payload, At: at, origin: m.sink, clientID: clientID, msgType: m.msg.Type}
	p.channelLimit = a.channelLimit()
	return p
}

// refuseEmit answers a refused client-emit in order with the acks: through
// the channel actor when there is one, since it may still hold an earlier emit
// of this connection whose ack is not sent yet. Without a channel actor no
// emit of the channel is in flight (a channel is only stopped once it has
// processed everything sent to it), so the refusal goes straight out, and
// refusals alone never start a channel actor.
func (a *projectActor) refuseEmit(ctx actor.Context, channel string, sink Sink, code proto.Code) {
	if _, ok := a.channels[channel]; ok {
		a.send(ctx, channel, &refuseEmit{sink: sink, code: code})
		return
	}
	sink.Send(errorFrame(&proto.Error{Code: code, Channel: channel}))
}

func (a *projectActor) isRevoked(c emitClaims, now time.Time) bool {
	if exp, ok := a.revokedJTIs[c.jti]; ok && now.Before(exp) {
		return true
	}
	r, ok := a.revokedClients[c.clientID]
	// Whole seconds: a token issued in the second of the revocation, or before, is revoked.
	return ok && now.Before(r.ExpiresAt) && c.iat.Unix() <= r.RevokedAt.Unix()
}

func (a *projectActor) addRevocations(revs []Revocation) {
	now := a.cfg.Now()
	for _, r := range revs {
		if !now.Before(r.ExpiresAt) {
			continue
		}
		switch r.Kind {
		case RevokeJTI:
			if r.ExpiresAt.After(a.revokedJTIs[r.Value]) {
				a.revokedJTIs[r.Value] = r.ExpiresAt
			}
		case RevokeClient:
			if old, ok := a.revokedClients[r.Value]; !ok || r.RevokedAt.After(old.RevokedAt) {
				r.ExpiresAt = maxTime(r.ExpiresAt, old.ExpiresAt) // a shorter revocation after a longer one keeps the longer's end
				a.revokedClients[r.Value] = r
			} else if r.ExpiresAt.After(old.ExpiresAt) {
				old.ExpiresAt = r.ExpiresAt
				a.revokedClients[r.Value] = old
			}
		}
	}
	a.pruneRevocations(now)
}

// pruneRevocations forgets revocations no token can match any more.
func (a *projectActor) pruneRevocations(now time.Time) {
	for k, exp := range a.revokedJTIs {
		if !now.Before(exp) {
			delete(a.revokedJTIs, k)
		}
	}
	for k, r := range a.revokedClients {
		if !now.Before(r.ExpiresAt) {
			delete(a.revokedClients, k)
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
