package actors

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// Config is what the actors need from the service configuration.
type Config struct {
	EmitRatePerMinute    int // per-channel budget unless the project overrides it
	ProjectRatePerMinute int // project-wide backstop
	ChannelDormancy      time.Duration
	// ReplayTTL and ReplayMaxBytes bound each channel's replay ring.
	ReplayTTL      time.Duration
	ReplayMaxBytes int
	// ClientEmitRatePerSecond caps client-emits per clientId; TokenMaxTTL
	// caps a client-emit token's life from its iat.
	ClientEmitRatePerSecond int
	TokenMaxTTL             time.Duration
	LoadSettings            SettingsLoader
	// Webhooks delivers connect/disconnect events; nil sends none.
	Webhooks WebhookSender
	// NodeID prefixes connection ids so they are unique across nodes and restarts.
	NodeID string
	// MaxSubscriptions caps one connection's channels; MaxConnections caps a
	// project's live connections on this node. Zero means no cap.
	MaxSubscriptions int
	MaxConnections   int

	counters *Counters
	Logger   *slog.Logger
	Now      func() time.Time
}

// ErrTimeout is returned by the edge calls when the actors did not answer in time.
var ErrTimeout = errors.New("actors: no answer in time")

// System is the actor system and its edge: the only place where code outside
// the actors (HTTP handlers, the transport) talks to them.
type System struct {
	cfg  *Config
	as   *actor.ActorSystem
	root *actor.RootContext

	mu        sync.Mutex // guards spawning; lookups go through projects
	connProps *actor.Props
	projects  sync.Map // project id → *actor.PID
	live      sync.Map // project id → *atomic.Int64 live connections, for MaxConnections
}

// NewSystem starts an actor system whose library logs go to cfg.Logger at Warn and above.
func NewSystem(cfg Config) *System {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ChannelDormancy == 0 {
		cfg.ChannelDormancy = 30 * time.Second
	}
	if cfg.ReplayTTL == 0 {
		cfg.ReplayTTL = 20 * time.Second
	}
	if cfg.ReplayMaxBytes == 0 {
		cfg.ReplayMaxBytes = DefaultReplayMaxBytes
	}
	if cfg.ClientEmitRatePerSecond == 0 {
		cfg.ClientEmitRatePerSecond = 15
	}
	if cfg.TokenMaxTTL == 0 {
		cfg.TokenMaxTTL = 10 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.counters = &Counters{}
	if cfg.Webhooks == nil {
		cfg.Webhooks = func(string, string, ConnEvent) {}
	}
	if cfg.NodeID == "" {
		b := make([]byte, 4)
		rand.Read(b)
		cfg.NodeID = hex.EncodeToString(b)
	}
	actorLog := slog.New(minLevel{cfg.Logger.Handler(), slog.LevelWarn}).With("lib", "actor")
	as := actor.NewActorSystem(
		actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return actorLog }),
		actor.WithDeadLetterRequestLogging(false),
	)
	// One Props for every connection actor (a Props per connection cost about
	// 300 bytes of every idle connection); each learns its socket from connInit.
	connProps := actor.PropsFromProducer(func() actor.Actor { return &connActor{} },
		actor.WithSupervisor(resumeOnPanic), actor.WithDispatcher(dispatcher()))
	return &System{cfg: &cfg, as: as, root: as.Root, connProps: connProps}
}

// project returns the project actor, starting it on first use.
func (s *System) project(id string) *actor.PID {
	if pid, ok := s.projects.Load(id); ok {
		return pid.(*actor.PID)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if pid, ok := s.projects.Load(id); ok {
		return pid.(*actor.PID)
	}
	cfg := s.cfg
	mb := &mailboxDepth{}
	props := actor.PropsFromProducer(func() actor.Actor { p := newProjectActor(id, cfg); p.mailbox = mb; return p },
		actor.WithSupervisor(resumeOnPanic), mb.props(), actor.WithDispatcher(dispatcher()))
	pid, err := s.root.SpawnNamed(props, "project/"+id)
	if err != nil && !errors.Is(err, actor.ErrNameExists) {
		panic("spawn project actor: " + err.Error()) // only ErrNameExists is possible
	}
	s.projects.Store(id, pid)
	return pid
}

// Publish runs one emit through the project and channel actors and returns
// the channel actor's answer.
func (s *System) Publish(ctx context.Context, projectID, channel string, payload []byte) (PublishResult, error) {
	reply := make(chan PublishResult, 1)
	s.root.Send(s.project(projectID), &Publish{Channel: channel, Payload: payload, At: s.cfg.Now(), Reply: reply})
	select {
	case r := <-reply:
		return r, nil
	case <-ctx.Done():
		return PublishResult{}, ErrTimeout
	}
}

// Reserve takes one of a project's connection slots before a handshake is
// accepted; false when MaxConnections are live. Open's Session gives it back
// on close; a handshake that fails after Reserve calls Release.
func (s *System) Reserve(projectID string) bool {
	v, _ := s.live.LoadOrStore(projectID, new(atomic.Int64))
	n := v.(*atomic.Int64).Add(1)
	if s.cfg.MaxConnections > 0 && n > int64(s.cfg.MaxConnections) {
		v.(*atomic.Int64).Add(-1)
		return false
	}
	return true
}

// Release gives back a slot taken by Reserve.
func (s *System) Release(projectID string) {
	if v, ok := s.live.Load(projectID); ok {
		v.(*atomic.Int64).Add(-1)
	}
}

// Open starts the connection actor of a new socket of a project and returns
// the session the transport feeds. The connect is counted for usage.
func (s *System) Open(projectID string, sink Sink) *Session {
	project := s.project(projectID)
	s.root.Send(project, &connOpened{sink: sink})
	pid := s.root.Spawn(s.connProps)
	s.root.Send(pid, &connInit{sink: sink, project: project, maxSubs: s.cfg.MaxSubscriptions}) // its first message
	return &Session{sys: s, sink: sink, pid: pid, projectID: projectID}
}

// DrainUsage collects every running project's usage counters since the last
// drain (resetting them). Projects that do not answer before ctx ends keep
// their counts for the next drain.
func (s *System) DrainUsage(ctx context.Context) []Usage {
	var pids []*actor.PID
	s.projects.Range(func(_, pid any) bool {
		pids = append(pids, pid.(*actor.PID))
		return true
	})
	reply := make(chan Usage, len(pids))
	for _, pid := range pids {
		s.root.Send(pid, &usageDrain{reply: reply})
	}
	out := make([]Usage, 0, len(pids))
	for range pids {
		select {
		case u := <-reply:
			out = append(out, u)
		case <-ctx.Done():
			return out
		}
	}
	return out
}

// ProjectDeleted closes the project's connections and stops its actors.
func (s *System) ProjectDeleted(id string) {
	s.mu.Lock()
	pid, ok := s.projects.LoadAndDelete(id)
	s.mu.Unlock()
	if ok {
		s.root.Send(pid.(*actor.PID), &projectDeleted{})
	}
}

// Revoke applies stored revocations to a running project actor at once (a
// project actor started later loads them from the store).
func (s *System) Revoke(projectID string, revs []Revocation) {
	if pid, ok := s.projects.Load(projectID); ok {
		s.root.Send(pid.(*actor.PID), &revoked{revs: revs})
	}
}

// ClientEmitSecretChanged applies a new client-emit secret to a running
// project actor before the caller answers, so no token of the old secret
// passes afterwards.
func (s *System) ClientEmitSecretChanged(projectID, secret string) {
	if pid, ok := s.projects.Load(projectID); ok {
		s.root.Send(pid.(*actor.PID), &clientEmitSecret{secret: secret})
	}
}

// SettingsChanged makes a running project actor reload its settings.
func (s *System) SettingsChanged(id string) {
	if pid, ok := s.projects.Load(id); ok {
		s.root.Send(pid.(*actor.PID), &settingsChanged{})
	}
}

// ProjectStats asks a running project actor for its counters; ok is false
// when the project has no actor.
func (s *System) ProjectStats(ctx context.Context, id string) (Stats, bool, error) {
	pid, ok := s.projects.Load(id)
	if !ok {
		return Stats{}, false, nil
	}
	reply := make(chan Stats, 1)
	s.root.Send(pid.(*actor.PID), &statsRequest{reply: reply})
	select {
	case st := <-reply:
		return st, true, nil
	case <-ctx.Done():
		return Stats{}, true, ErrTimeout
	}
}

// Shutdown stops every project actor (and with them their channels), letting
// each finish the messages already queued.
func (s *System) Shutdown(ctx context.Context) error {
	var futures []*actor.Future
	s.projects.Range(func(_, pid any) bool {
		futures = append(futures, s.root.PoisonFuture(pid.(*actor.PID)))
		return true
	})
	for _, f := range futures {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		_ = f.Wait()
	}
	s.as.Shutdown()
	return nil
}

// minLevel drops records below a level: protoactor logs lifecycle at Info.
type minLevel struct {
	slog.Handler
	min slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(attrs []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(attrs), h.min}
}

func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{h.Handler.WithGroup(name), h.min}
}
