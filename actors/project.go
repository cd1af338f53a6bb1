package actors

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/transport"
)

// childChannel is the project's view of one channel actor.
type childChannel struct {
	pid  *actor.PID
	sent uint64 // messages sent to it, compared with mayStop.processed
}

// projectActor owns a project's live state: its channels (children), the
// project-wide emit backstop, settings, connections and usage counters.
// Every field is owned by Receive.
//
// Its states are protoactor behaviors. loading: the first settings load is
// under way; emits (HTTP and client) wait, at most maxHeld of them, and an
// HTTP emit whose edge has given up by then is dropped, never delivered
// late (Publish.abandon). unavailable: a load failed and is retried with
// backoff; emits are answered service_unavailable at once. ready: everything.
// In every state connections, subscriptions and counters work as usual
// (they do not depend on settings); connect/disconnect webhooks wait for the
// first settings, at most maxHeld of them. A project the store does not know
// stops, closing its connections. With no connections, channels, counts or
// live budgets for a quiet period (Config.ActorDormancy) the actor stops; the
// edge starts a new one when the project is next used (see projectRef).
type projectActor struct {
	id       string
	cfg      *Config
	log      *slog.Logger
	behavior actor.Behavior
	ref      *projectRef
	retired  func() // tells the edge this actor has stopped for good

	settings    Settings
	isReady     bool          // the first settings load succeeded (the ready state)
	loading     bool          // a settings load is under way (its result comes as settingsLoaded)
	loadFails   int           // loads failed in a row, for the retry backoff
	heldHooks   []heldWebhook // webhooks that arrived before the first load
	droppedHook int           // held webhooks dropped over maxHeld
	heldEmits   []any         // *Publish and *clientEmit waiting for the first load

	// hooks is the channel and presence webhook target of the settings
	// (nil: none); the channel actors (one node) and the channel grains that
	// watch it here (hookWatchers, a cluster) are told it when it changes.
	hooks        *hookTarget
	toldLimit    int                   // the channel limit the watching grains were last told (setHooks)
	toldHistory  bool                  // and whether the project keeps history
	hookWatchers map[string]*actor.PID // by PID id (grains of this node)

	backstop fixedWindow     // one node; in a cluster the project grain counts it (budgets)
	budgets  *projectBudgets // nil on one node
	channels map[string]*childChannel
	conns    map[uint64]liveConn

	// Client-emit state (client-emit rules 5 and 6).
	revokedJTIs    map[string]time.Time  // jti → when the revocation may be forgotten
	revokedClients map[string]Revocation // clientId → latest revocation
	clientWindows  clientWindows         // clientId → 1-second window (one node)
	gen            uint64                // bumped by every change applied by message
	processed      uint64                // edge messages processed (projectRef's count)
	mailbox        *mailboxState

	quiet quietPeriod

	connects int64
	usage    *projectUsage // emits, counted by the channels where they are accepted

	// Channel authorization: the settings its connections read (stored at
	// every load), and the connections whose token expires (authz.go).
	authz       *authzHolder
	tokenConns  int             // conns with a token watched (ident set)
	warned      map[uint64]bool // conns told their token expires soon
	tokenTicker bool
}

// liveConn is one connection of the project, the public key it used and
// its connection token's identity (nil: none, or no longer watched).
type liveConn struct {
	sink    Sink
	keyHash string // the key index's string: every connection of a key shares its bytes
	ident   *Identity
}

// projectUsage is the one count a project's channel actors add to: emits
// they accepted. An atomic, so that an emit a channel refuses was never
// counted and a count can never go negative.
type projectUsage struct {
	emits       atomic.Int64
	replayBytes replayBudget   // held by the channels' replay rings together
	health      *projectHealth // the live figures (health.go)
}

// heldWebhook is a connect or disconnect waiting for the first settings load.
type heldWebhook struct {
	kind   string
	connID uint64
	status CloseStatus
	at     time.Time
}

// maxHeld bounds the emits, and separately the webhooks, a loading project holds.
const maxHeld = 1024

// Backoff of a failed settings load: 1 s, doubling, at most 30 s.
const (
	loadRetryFirst = time.Second
	loadRetryMax   = 30 * time.Second
)

func newProjectActor(id string, cfg *Config, ref *projectRef, retired func(), authz *authzHolder) *projectActor {
	a := &projectActor{
		id: id, cfg: cfg, log: cfg.Logger.With("project", id), ref: ref, retired: retired, authz: authz,
		backstop: fixedWindow{size: time.Minute},
		channels: map[string]*childChannel{},
		conns:    map[uint64]liveConn{},
		usage:    &projectUsage{health: cfg.health.of(id)},

		revokedJTIs:    map[string]time.Time{},
		revokedClients: map[string]Revocation{},
		clientWindows:  clientWindows{},
		hookWatchers:   map[string]*actor.PID{},
	}
	if c := cfg.cluster.Load(); c != nil {
		a.budgets = newProjectBudgets(c, id)
	}
	a.behavior = actor.NewBehavior()
	a.behavior.Become(a.whileLoading)
	return a
}

func (a *projectActor) Receive(ctx actor.Context) {
	if _, ok := ctx.Message().(edgeMessage); ok {
		a.processed++
	}
	a.behavior.Receive(ctx)
}

// whileLoading is the state until the first settings load answers.
func (a *projectActor) whileLoading(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *Publish, *clientEmit:
		if len(a.heldEmits) < maxHeld {
			a.heldEmits = append(a.heldEmits, m)
		} else {
			a.refuse(ctx, m)
		}
	default:
		a.common(ctx)
	}
}

// whileUnavailable is the state after a failed load, until one succeeds.
func (a *projectActor) whileUnavailable(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *Publish, *clientEmit:
		a.refuse(ctx, m)
	default:
		a.common(ctx)
	}
}

// whenReady is the state once settings are loaded.
func (a *projectActor) whenReady(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *Publish, *clientEmit:
		a.emit(ctx, m)
	default:
		a.common(ctx)
	}
}

func (a *projectActor) emit(ctx actor.Context, msg any) {
	switch m := msg.(type) {
	case *Publish:
		if !m.abandoned() {
			a.publish(ctx, m)
		}
	case *clientEmit:
		a.clientEmit(ctx, m)
	}
}

// refuse answers an emit service_unavailable: the project's settings are not known.
func (a *projectActor) refuse(ctx actor.Context, msg any) {
	switch m := msg.(type) {
	case *Publish:
		m.Reply <- PublishResult{Err: &proto.Error{Code: proto.CodeUnavailable}}
	case *clientEmit:
		a.refuseEmit(ctx, m.msg.Channel, m.sink, proto.CodeUnavailable)
	}
}

// common handles what every state does alike.
func (a *projectActor) common(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		scheduleQuietTick(ctx, a.cfg.ActorDormancy)
		a.loadSettings(ctx)
		if a.budgets != nil {
			a.startBudgets(ctx)
		}
	case *settingsLoaded:
		a.applySettings(ctx, m)
	case *settingsChanged:
		a.gen++ // a load under way may predate the change: its result is not applied
		a.loadSettings(ctx)
	case *retryLoad:
		a.loadSettings(ctx)
	case *inspectProject:
		a.inspect(m)
	case *watchHooks:
		a.hookWatchers[m.grain.Id] = m.grain
		if a.isReady {
			ctx.Send(m.grain, &hooksChanged{target: a.hooks, channelLimit: a.channelLimit(), history: a.keepsHistory()})
		}
	case *unwatchHooks:
		if w, ok := a.hookWatchers[m.grain.Id]; ok && w.Equal(m.grain) {
			delete(a.hookWatchers, m.grain.Id)
		}
	case *channelQuery:
		a.query(ctx, m)
	case *revoked:
		a.gen++
		a.addRevocations(m.revs)
		a.expireTokens(ctx) // a connection whose token a new revocation covers closes
	case *clientEmitSecret:
		a.gen++
		a.settings.ClientEmitSecret = m.secret
	case *subscribe:
		m.history = a.historyMode()
		a.send(ctx, m.channel, m)
	case *unsubscribe:
		a.send(ctx, m.channel, m)
	case *connOpened:
		c := liveConn{sink: m.sink, keyHash: m.keyHash}
		a.conns[m.sink.ID()] = c
		if m.ident != nil {
			a.trackToken(ctx, c, m.ident)
		}
		a.connects++
		a.webhook("connect", m.sink.ID(), CloseStatus{})
	case *authzChanged:
		a.gen++ // a load under way may predate the change: its result is not applied
		a.settings.Authz = *m.az
		a.authz.load(m.az)
		close(m.done)
		a.expireTokens(ctx) // turned on again: the tokens kept are checked (off: nothing is)
	case *tokenRefreshed:
		if c, ok := a.conns[m.sink.ID()]; ok && a.trackToken(ctx, c, m.ident) {
			m.sink.Send(refreshOKFrame)
		}
	case *tokenTick:
		a.tokenTicker = false
		a.expireTokens(ctx)
	case *connClosed:
		if c, ok := a.conns[m.connID]; ok {
			delete(a.conns, m.connID)
			a.forgetToken(c)
			a.webhook("disconnect", m.connID, m.status)
		}
		for _, ch := range m.channels {
			if c, ok := a.channels[ch]; ok {
				c.sent++
				ctx.Send(c.pid, &unsubscribe{channel: ch, connID: m.connID, silent: true})
			}
		}
	case *refund:
		a.refundBackstop(m.window)
	case *mayStop:
		if c, ok := a.channels[m.channel]; ok && c.pid.Equal(m.pid) && c.sent == m.processed {
			delete(a.channels, m.channel)
			ctx.Stop(c.pid)
		}
	case *projectDeleted:
		a.stop(ctx, "project deleted")
	case *topologyChanged:
		if a.budgets != nil {
			a.budgets.grain.moved(ctx)
		}
		for _, c := range a.channels {
			c.sent++
			ctx.Send(c.pid, m)
		}
	case *keysRevoked:
		revoked := make(map[string]bool, len(m.hashes))
		for _, h := range m.hashes {
			revoked[h] = true
		}
		for _, c := range a.conns {
			if revoked[c.keyHash] {
				c.sink.Close(proto.CloseKeyRevoked, "key revoked")
			}
		}
	case *usageDrain:
		u := Usage{ProjectID: a.id, Connects: a.connects, Emits: a.usage.emits.Swap(0), Connections: len(a.conns)}
		if c := a.cfg.cluster.Load(); c != nil && len(a.conns) > 0 {
			u.Connections += c.sys.connectionsElsewhere(a.id) // the peak sample is the cluster's
		}
		a.connects = 0
		m.reply <- u
	case *historyModeAsk:
		m.reply <- a.historyMode()
	case *quietTick:
		scheduleQuietTick(ctx, a.cfg.ActorDormancy)
		if a.quiet.dormantAgain(a.dormant()) && a.ref.retire(a.processed) {
			a.retired()
			ctx.Stop(ctx.Self())
		}
	case *actor.Stopping:
		a.authz.loaded.Store(false) // the next handshake's reading stands in until a new actor loads
		if a.budgets != nil {
			a.releaseIdleHolds(ctx, a.cfg.Now(), true)
			a.budgets.grain.stop(ctx)
		}
	default:
		if a.budgets != nil {
			a.budgetMessage(ctx, m)
		}
	}
}

// dormant: nothing is held that a fresh actor, loading from the store, would
// not have: no connections or channels, no counts waiting for the rollup,
// budget windows run out, no load under way.
func (a *projectActor) dormant() bool {
	now := a.cfg.Now()
	if len(a.conns) > 0 || len(a.channels) > 0 || len(a.hookWatchers) > 0 || a.connects != 0 || a.usage.emits.Load() != 0 ||
		a.loading || len(a.heldHooks) > 0 || len(a.heldEmits) > 0 || !a.backstop.idle(now) ||
		(a.budgets != nil && a.budgets.waiting()) {
		return false
	}
	return a.clientWindows.idle(now)
}

// stop closes every connection of the project and stops the actor (its
// channels stop with it). The edge forgets it first, so nothing new reaches it.
func (a *projectActor) stop(ctx actor.Context, reason string) {
	a.ref.retireNow()
	a.retired()
	for _, e := range a.heldEmits {
		a.refuse(ctx, e)
	}
	a.heldEmits = nil
	a.refuseHeldBudgets(ctx)
	for _, c := range a.conns {
		c.sink.Close(proto.CloseProjectDeleted, reason)
	}
	for _, g := range a.hookWatchers { // no more webhooks for a project that is gone
		ctx.Send(g, &hooksChanged{})
	}
	ctx.Stop(ctx.Self())
}

// publish checks the project backstop, then forwards to the channel actor,
// which answers the edge. Refused emits still go to the channel so that every
// 429 carries both budgets (proto/PROTOCOL.md › POST /emit: the 429 body).
func (a *projectActor) publish(ctx actor.Context, m *Publish) {
	m.channelLimit = a.channelLimit()
	m.history = a.historyMode() == historyOn
	if a.budgets != nil { // the cluster's backstop: the node's lease of it (cluster_project_budgets.go)
		a.leasedPublish(ctx, m)
		return
	}
	var ok bool
	m.projectBudget, ok = a.backstop.take(m.At, a.cfg.ProjectRatePerMinute)
	m.projectDenied = !ok
	a.send(ctx, m.Channel, m)
}

// channelLimit is the project's channel budget per minute.
func (a *projectActor) channelLimit() int {
	if a.settings.ChannelRateLimit > 0 {
		return a.settings.ChannelRateLimit
	}
	return a.cfg.EmitRatePerMinute
}

// refundBackstop gives back the backstop unit an emit took in the window
// ending at window: to the node's share in a cluster, else to this actor's
// window.
func (a *projectActor) refundBackstop(window time.Time) {
	if a.budgets != nil {
		a.budgets.lease.refund(window)
		return
	}
	a.backstop.refund(window)
}

// send delivers msg to the channel actor, starting it if needed, unless the
// project holds MaxChannelsPerProject channels already.
func (a *projectActor) send(ctx actor.Context, channel string, msg any) {
	c, ok := a.channels[channel]
	if !ok {
		if u, leaving := msg.(*unsubscribe); leaving { // nothing to leave: no channel needed
			if !u.silent {
				u.sink.Send(transport.TextFrame(proto.AppendAck(nil, proto.ActionUnsubscribe, channel)))
			}
			return
		}
		if max := a.cfg.MaxChannelsPerProject; max > 0 && len(a.channels) >= max {
			a.refuseNewChannel(ctx, channel, msg)
			return
		}
		cfg, usage, id, hooks := a.cfg, a.usage, a.id, knownHooks(a.isReady, a.hooks)
		mb := &mailboxState{}
		produce := func() actor.Actor {
			c := newChannelActor(id, channel, cfg, usage, hooks)
			c.mailbox = mb
			return c
		}
		if cl := a.cfg.cluster.Load(); cl != nil {
			produce = func() actor.Actor {
				r := newChannelRelay(cl, id, channel, cfg, usage)
				r.mailbox = mb
				return r
			}
		}
		props := actor.PropsFromProducer(produce, actor.WithSupervisor(resumeOnPanic), mb.props(), actor.WithDispatcher(a.cfg.dispatch))
		c = &childChannel{pid: ctx.Spawn(props)}
		a.channels[channel] = c
	}
	c.sent++
	if p, ok := msg.(*Publish); ok {
		// On an HTTP handler's goroutine, the channel's turn runs there too.
		p.posterRuns = a.mailbox.forwardHere()
	}
	ctx.Send(c.pid, msg)
}

// refuseNewChannel answers what would have started a channel past the cap
// (a refuseEmit never does: refuseEmit sends it only to a running channel).
func (a *projectActor) refuseNewChannel(ctx actor.Context, channel string, msg any) {
	e := &proto.Error{Code: proto.CodeTooManyChannels, Channel: channel}
	switch m := msg.(type) {
	case *Publish:
		if !m.projectDenied {
			a.refundBackstop(m.projectBudget.ResetAt)
		}
		if m.Reply != nil {
			m.Reply <- PublishResult{Err: &proto.Error{Code: proto.CodeTooManyChannels}}
		} else {
			m.origin.Send(errorFrame(e))
		}
	case *subscribe:
		m.refuse(ctx, proto.CodeTooManyChannels, channelSub{}, false) // a new channel: nothing to keep
	}
}

// loadSettings runs the store call beside the actor and brings the result back
// as a message, so a slow database never stalls Receive. One load at a time:
// a change that arrives meanwhile bumps gen, and the stale result loads again.
func (a *projectActor) loadSettings(ctx actor.Context) {
	if a.loading {
		return
	}
	a.loading = true
	self, root, load, id, gen := ctx.Self(), ctx.ActorSystem().Root, a.cfg.LoadSettings, a.id, a.gen
	go func() {
		lctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := load(lctx, id)
		root.Send(self, &settingsLoaded{settings: s, gen: gen, err: err})
	}()
}

func (a *projectActor) applySettings(ctx actor.Context, m *settingsLoaded) {
	a.loading = false
	switch {
	case errors.Is(m.err, ErrProjectNotFound):
		a.log.Info("project not found: stopping its actor")
		a.stop(ctx, "project not found")
		return
	case m.err != nil:
		// Without settings the override could be bypassed: emits are
		// refused until a load succeeds (a ready project keeps the settings
		// it has), and the load is tried again, backing off.
		delay := min(loadRetryFirst<<min(a.loadFails, 5), loadRetryMax)
		a.loadFails++
		a.log.Error("load project settings", "err", m.err, "retry_in", delay.String())
		sendLater(ctx, delay, &retryLoad{})
		if !a.isReady {
			for _, e := range a.heldEmits {
				a.refuse(ctx, e)
			}
			a.heldEmits = nil
			a.behavior.Become(a.whileUnavailable)
		}
		return
	}
	a.loadFails = 0
	a.addRevocations(m.settings.Revocations) // revocations only accumulate
	if m.gen != a.gen {
		// A change arrived by message while this load was under way; the load
		// may predate it (an old client-emit secret, say). Load again.
		a.loadSettings(ctx)
		return
	}
	m.settings.Revocations = nil
	a.settings = m.settings
	az := m.settings.Authz
	a.authz.load(&az)
	a.expireTokens(ctx) // connections that opened while it loaded: revocations, expiries
	a.setHooks(ctx, hookTargetOf(m.settings), !a.isReady)
	a.becomeReady(ctx)
}

// setHooks tells the channel actors (one node) and the watching grains the
// project's channel and presence webhook target: at the first load, when
// they wait for it, and then whenever it changes. A project that never opts
// in costs one message per channel at its first load, nothing after. The
// grains get the channel limit with it (they apply it; a channel actor is
// given it with each emit), so they are told when either changes.
func (a *projectActor) setHooks(ctx actor.Context, t *hookTarget, first bool) {
	limit, history := a.channelLimit(), a.keepsHistory()
	targetChanged := first || !sameTarget(a.hooks, t)
	if !targetChanged && limit == a.toldLimit && history == a.toldHistory {
		return
	}
	a.hooks, a.toldLimit, a.toldHistory = t, limit, history
	if targetChanged && a.cfg.cluster.Load() == nil { // in a cluster the children are relays: the grains decide
		for _, c := range a.channels {
			c.sent++
			ctx.Send(c.pid, &hooksChanged{target: t})
		}
	}
	for _, g := range a.hookWatchers {
		ctx.Send(g, &hooksChanged{target: t, channelLimit: limit, history: history})
	}
}

// becomeReady leaves the loading or unavailable state: the held webhooks
// are sent and the held emits run, in the order they came.
func (a *projectActor) becomeReady(ctx actor.Context) {
	a.isReady = true
	a.behavior.Become(a.whenReady)
	held := a.heldEmits
	a.heldEmits = nil
	for _, e := range held {
		a.emit(ctx, e)
	}
	if len(a.heldHooks) > 0 || a.droppedHook > 0 {
		if a.droppedHook > 0 {
			a.log.Warn("webhooks dropped while the project loaded", "dropped", a.droppedHook)
		}
		for _, h := range a.heldHooks {
			a.sendWebhook(h)
		}
		a.heldHooks, a.droppedHook = nil, 0
	}
}

// resumeOnPanic keeps a channel's seq and subscribers after a bug panics in
// Receive: the message is dropped and logged, the state stays.
var resumeOnPanic = actor.NewOneForOneStrategy(10, 10*time.Second, func(reason any) actor.Directive {
	return actor.ResumeDirective
})

// webhook hands a connect or disconnect to the delivery queue, if the
// project has a webhook; delivery happens elsewhere, never in Receive. Before
// the settings are known it is held (bounded).
func (a *projectActor) webhook(kind string, connID uint64, status CloseStatus) {
	h := heldWebhook{kind: kind, connID: connID, status: status, at: a.cfg.Now()}
	if !a.isReady {
		if len(a.heldHooks) < maxHeld {
			a.heldHooks = append(a.heldHooks, h)
		} else {
			a.droppedHook++
		}
		return
	}
	a.sendWebhook(h)
}

func (a *projectActor) sendWebhook(h heldWebhook) {
	if a.settings.WebhookURL == "" {
		return
	}
	a.cfg.Webhooks(a.settings.WebhookURL, a.settings.WebhookSecret, WebhookEvent{
		Kind: h.kind, ProjectID: a.id, ConnectionID: a.cfg.NodeID + "-" + strconv.FormatUint(h.connID, 10),
		At: h.at, Status: h.status,
	})
}
