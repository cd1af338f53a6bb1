package actors

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// childChannel is the project's view of one channel actor.
type childChannel struct {
	pid  *actor.PID
	sent uint64 // messages sent to it, compared with mayStop.processed
}

// projectActor owns a project's live state: its channels (children), the
// project-wide emit backstop, settings, connections and usage counters.
// Every field is owned by Receive.
type projectActor struct {
	id       string
	cfg      *Config
	log      *slog.Logger
	settings Settings
	loaded   bool
	pending  []any // messages that arrived before the first settings load

	backstop fixedWindow
	channels map[string]*childChannel
	conns    map[uint64]Sink

	// Client-emit state (SPEC.md › Client-emit rules 5 and 6).
	revokedJTIs    map[string]time.Time    // jti → when the revocation may be forgotten
	revokedClients map[string]Revocation   // clientId → latest revocation
	clientWindows  map[string]*fixedWindow // clientId → 1-second window
	gen            uint64                  // bumped by every change applied by message
	mailbox        *mailboxDepth

	connects int64
	emits    int64
}

func newProjectActor(id string, cfg *Config) *projectActor {
	return &projectActor{
		id: id, cfg: cfg, log: cfg.Logger.With("project", id),
		backstop: fixedWindow{size: time.Minute},
		channels: map[string]*childChannel{},
		conns:    map[uint64]Sink{},

		revokedJTIs:    map[string]time.Time{},
		revokedClients: map[string]Revocation{},
		clientWindows:  map[string]*fixedWindow{},
	}
}

func (a *projectActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		a.loadSettings(ctx)
		return
	case *settingsLoaded:
		a.applySettings(ctx, m)
		return
	case *settingsChanged:
		a.loadSettings(ctx)
		return
	case *inspectProject:
		a.inspect(m)
		return
	case *revoked:
		a.gen++
		a.addRevocations(m.revs)
		return
	case *clientEmitSecret:
		a.gen++
		a.settings.ClientEmitSecret = m.secret
		return
	case *actor.Terminated, *actor.Stopping, *actor.Stopped, *actor.Restarting:
		return
	}
	if !a.loaded {
		a.pending = append(a.pending, ctx.Message())
		return
	}
	a.handle(ctx, ctx.Message())
}

func (a *projectActor) handle(ctx actor.Context, msg any) {
	switch m := msg.(type) {
	case *Publish:
		a.publish(ctx, m)
	case *clientEmit:
		a.clientEmit(ctx, m)
	case *subscribe:
		a.send(ctx, m.channel, m)
	case *unsubscribe:
		a.send(ctx, m.channel, m)
	case *connOpened:
		a.conns[m.sink.ID()] = m.sink
		a.connects++
		a.webhook("connect", m.sink.ID(), CloseStatus{})
	case *connClosed:
		if _, ok := a.conns[m.connID]; ok {
			delete(a.conns, m.connID)
			a.webhook("disconnect", m.connID, m.status)
		}
		for _, ch := range m.channels {
			if c, ok := a.channels[ch]; ok {
				c.sent++
				ctx.Send(c.pid, &unsubscribe{channel: ch, connID: m.connID, silent: true})
			}
		}
	case *refund:
		a.backstop.refund(m.at)
		a.emits--
	case *mayStop:
		if c, ok := a.channels[m.channel]; ok && c.pid.Equal(m.pid) && c.sent == m.processed {
			delete(a.channels, m.channel)
			ctx.Stop(c.pid)
		}
	case *projectDeleted:
		for _, s := range a.conns {
			s.Close(CloseProjectDeleted, "project deleted")
		}
		ctx.Stop(ctx.Self())
	case *usageDrain:
		u := Usage{ProjectID: a.id, Connects: a.connects, Emits: max(a.emits, 0), Connections: len(a.conns)}
		a.connects -= u.Connects
		a.emits -= u.Emits // a refund still on its way leaves a negative remainder for next time
		m.reply <- u
	case *statsRequest:
		m.reply <- Stats{Connections: len(a.conns), Channels: len(a.channels), Connects: a.connects, Emits: a.emits}
	}
}

// publish checks the project backstop, then forwards to the channel actor,
// which answers the edge. Refused emits still go to the channel so that every
// 429 carries both budgets (SPEC.md › Emit endpoint).
func (a *projectActor) publish(ctx actor.Context, m *Publish) {
	m.channelLimit = a.cfg.EmitRatePerMinute
	if a.settings.ChannelRateLimit > 0 {
		m.channelLimit = a.settings.ChannelRateLimit
	}
	var ok bool
	m.projectBudget, ok = a.backstop.take(m.At, a.cfg.ProjectRatePerMinute)
	m.projectDenied = !ok
	if ok {
		a.emits++ // usage: an emit counts once the budgets let it through; refund undoes it
	}
	a.send(ctx, m.Channel, m)
}

// send delivers msg to the channel actor, starting it if needed.
func (a *projectActor) send(ctx actor.Context, channel string, msg any) {
	c, ok := a.channels[channel]
	if !ok {
		cfg := a.cfg
		mb := &mailboxDepth{}
		props := actor.PropsFromProducer(func() actor.Actor { c := newChannelActor(channel, cfg); c.mailbox = mb; return c },
			actor.WithSupervisor(resumeOnPanic), mb.props(), actor.WithDispatcher(dispatcher()))
		c = &childChannel{pid: ctx.Spawn(props)}
		a.channels[channel] = c
	}
	c.sent++
	ctx.Send(c.pid, msg)
}

// loadSettings runs the store call beside the actor and brings the result back
// as a message, so a slow database never stalls Receive.
func (a *projectActor) loadSettings(ctx actor.Context) {
	self, root, load, id, gen := ctx.Self(), ctx.ActorSystem().Root, a.cfg.LoadSettings, a.id, a.gen
	go func() {
		lctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := load(lctx, id)
		root.Send(self, &settingsLoaded{settings: s, gen: gen, err: err})
	}()
}

func (a *projectActor) applySettings(ctx actor.Context, m *settingsLoaded) {
	if m.err != nil {
		a.log.Error("load project settings", "err", m.err)
		if !a.loaded {
			// Without settings the override could be bypassed: retry, holding messages.
			self, root := ctx.Self(), ctx.ActorSystem().Root
			time.AfterFunc(time.Second, func() { root.Send(self, &settingsChanged{}) })
		}
		return
	}
	a.addRevocations(m.settings.Revocations) // revocations only accumulate
	if m.gen != a.gen {
		// A change arrived by message while this load was under way; the load
		// may predate it (an old client-emit secret, say). Load again.
		a.loadSettings(ctx)
		return
	}
	m.settings.Revocations = nil
	a.settings = m.settings
	if !a.loaded {
		a.loaded = true
		pending := a.pending
		a.pending = nil
		for _, p := range pending {
			a.handle(ctx, p)
		}
	}
}

// resumeOnPanic keeps a channel's seq and subscribers after a bug panics in
// Receive: the message is dropped and logged, the state stays.
var resumeOnPanic = actor.NewOneForOneStrategy(10, 10*time.Second, func(reason any) actor.Directive {
	return actor.ResumeDirective
})

// webhook hands a connect or disconnect to the delivery queue, if the
// project has a webhook; delivery happens elsewhere, never in Receive.
func (a *projectActor) webhook(kind string, connID uint64, status CloseStatus) {
	if a.settings.WebhookURL == "" {
		return
	}
	a.cfg.Webhooks(a.settings.WebhookURL, a.settings.WebhookSecret, ConnEvent{
		Kind: kind, ProjectID: a.id, ConnectionID: a.cfg.NodeID + "-" + strconv.FormatUint(connID, 10),
		At: a.cfg.Now(), Status: status,
	})
}
