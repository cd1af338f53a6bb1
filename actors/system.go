package actors

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/lestrrat-go/jwx/v2/jwk"

	"github.com/relayhq/relay/proto/clusterpb"
)

// Config is what the actors need from the service configuration.
type Config struct {
	EmitRatePerMinute    int // per-channel budget unless the project overrides it
	ProjectRatePerMinute int // project-wide backstop
	// ActorDormancy is how long a channel or project actor with nothing to
	// keep (no subscribers or connections, budgets run out, replay ring
	// empty, counts rolled up) waits before it stops.
	ActorDormancy time.Duration
	// ReplayTTL and ReplayMaxBytes bound each channel's replay ring.
	ReplayTTL      time.Duration
	ReplayMaxBytes int
	// ClientEmitRatePerSecond caps client-emits per clientId; TokenMaxTTL
	// caps a client-emit token's life from its iat.
	ClientEmitRatePerSecond int
	TokenMaxTTL             time.Duration
	LoadSettings            SettingsLoader
	// Webhooks delivers the webhook events (connect, disconnect, and the
	// channel and presence events a project opted in to); nil sends none.
	Webhooks WebhookSender
	// NodeID prefixes connection ids so they are unique across nodes and restarts.
	NodeID string
	// MaxSubscriptions caps one connection's channels; MaxConnections caps a
	// project's live connections (in a cluster, of every node, within the
	// tolerance of cluster_conns.go). Zero means no cap.
	MaxSubscriptions int
	MaxConnections   int
	// Bounds on what one client or tenant can make a node hold; zero means no cap.
	MaxClientIDBytes         int // a presence clientId's length
	MaxPresenceMembers       int // distinct presence clientIds on one channel
	MaxChannelsPerProject    int // channel actors of one project
	MaxReplayBytesPerProject int // replay rings of one project together
	MaxConnectionsPerAddress int // live connections of one project from one client address
	// JWKSClient fetches the projects' JWKS (channel authorization with
	// their own keys, authz_jwks.go); the server's refuses loopback,
	// private and link-local addresses as the webhooks' does, and answers
	// over JWKSMaxBody. nil: no fetches, every token signed with a JWKS key
	// is refused.
	JWKSClient jwk.HTTPClient
	// History is the store's channel history (history.go); nil: no project
	// keeps history on this node, whatever its setting.
	History HistoryStore

	historyWriter *historyWriter // the node's, when History is set

	counters *Counters
	jwks     *jwksCache               // the process's JWKS cache (authz_jwks.go)
	health   *healthBook              // delivery health per project (health.go)
	cluster  *atomic.Pointer[Cluster] // the System's, set by NewSystem: channels become relays in a cluster
	dispatch *poolDispatcher          // the System's (dispatch.go)
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
	spawned   uint64     // project actors spawned, for unique names (under mu)
	connProps *actor.Props
	projects  sync.Map // project id → *projectRef
	authz     sync.Map // project id → *authzHolder: channel authorization, shared with its connections

	liveMu sync.Mutex
	live   map[string]int        // project id → live connections on this node, for MaxConnections
	byAddr map[string]*addrCount // project id + client address → live connections, for MaxConnectionsPerAddress
	// elsewhere: in a cluster, the project's live connections on the other
	// members, as they last said (cluster_conns.go), for MaxConnections.
	elsewhere map[string]int

	cluster atomic.Pointer[Cluster] // nil on one node (cluster.go)
}

// projectRef is the edge's handle on one project actor. Its state counts the
// edge's messages posted to the actor; the actor sets the top bit (retire)
// only when it has processed exactly that many, as it stops for dormancy. An
// edge that finds the bit set starts a new actor instead, so no message is
// ever posted to a project actor that has decided to stop.
type projectRef struct {
	pid   *actor.PID
	state atomic.Uint64
}

const retiredBit = 1 << 63

// enter counts one message about to be posted; false once retired.
func (r *projectRef) enter() bool {
	for {
		s := r.state.Load()
		if s&retiredBit != 0 {
			return false
		}
		if r.state.CompareAndSwap(s, s+1) {
			return true
		}
	}
}

// retire marks the ref retired if processed is every message the edge posted.
func (r *projectRef) retire(processed uint64) bool {
	return r.state.CompareAndSwap(processed, processed|retiredBit)
}

// retireNow marks the ref retired whatever is in flight: the actor is
// stopping (its project is gone), and what the edge posts meanwhile is lost
// with it.
func (r *projectRef) retireNow() { r.state.Or(retiredBit) }

// NewSystem starts an actor system whose library logs go to cfg.Logger at Warn and above.
func NewSystem(cfg Config) *System {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.ActorDormancy = cmp.Or(cfg.ActorDormancy, 30*time.Second)
	cfg.ReplayTTL = cmp.Or(cfg.ReplayTTL, 20*time.Second)
	cfg.ReplayMaxBytes = cmp.Or(cfg.ReplayMaxBytes, DefaultReplayMaxBytes)
	cfg.ClientEmitRatePerSecond = cmp.Or(cfg.ClientEmitRatePerSecond, 15)
	cfg.TokenMaxTTL = cmp.Or(cfg.TokenMaxTTL, 10*time.Minute)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	cfg.counters = &Counters{}
	cfg.jwks = newJWKSCache(cfg.JWKSClient, cfg.Logger, cfg.Now)
	cfg.health = &healthBook{m: map[string]*projectHealth{}}
	if cfg.Webhooks == nil {
		cfg.Webhooks = func(string, string, WebhookEvent) {}
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
	// Its mailbox is the lock-free one: an idle connection holds no ring
	// buffer (10 slots, the default's), 190 bytes less of its live heap
	// (relay-bench conns, 15 000 sockets: 1.70 against 1.89 KiB), for one
	// 24-byte allocation per message, of which a socket gets few.
	cfg.dispatch = newSystemDispatcher()
	connProps := actor.PropsFromProducer(func() actor.Actor { return &connActor{} },
		actor.WithSupervisor(resumeOnPanic), actor.WithDispatcher(cfg.dispatch), actor.WithMailbox(actor.UnboundedLockfree()))
	s := &System{cfg: &cfg, as: as, root: as.Root, connProps: connProps, live: map[string]int{}, byAddr: map[string]*addrCount{}, elsewhere: map[string]int{}}
	s.cfg.cluster = &s.cluster
	if cfg.History != nil {
		s.cfg.historyWriter = newHistoryWriter(cfg.History, as.Root, cfg.Logger.With("part", "history"))
	}
	return s
}

// tell posts an edge message to the project actor, starting one if the
// project has none running (or its actor is retiring); it returns the actor.
func (s *System) tell(id string, msg edgeMessage) *actor.PID {
	for {
		if v, ok := s.projects.Load(id); ok {
			if ref := v.(*projectRef); ref.enter() {
				s.root.Send(ref.pid, msg)
				return ref.pid
			}
		}
		s.spawnProject(id)
	}
}

// tellRunning posts an edge message only if the project's actor is running;
// a project actor started later loads the same state from the store.
func (s *System) tellRunning(id string, msg edgeMessage) bool {
	v, ok := s.projects.Load(id)
	if !ok || !v.(*projectRef).enter() {
		return false
	}
	s.root.Send(v.(*projectRef).pid, msg)
	return true
}

// spawnProject starts a project actor unless a live one is already known.
func (s *System) spawnProject(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.projects.Load(id); ok && v.(*projectRef).state.Load()&retiredBit == 0 {
		return
	}
	s.spawned++
	cfg, ref, authz := s.cfg, &projectRef{}, s.authzOf(id)
	retired := func() { s.projects.CompareAndDelete(id, ref) }
	mb := &mailboxState{}
	props := actor.PropsFromProducer(func() actor.Actor {
		p := newProjectActor(id, cfg, ref, retired, authz)
		p.mailbox = mb
		return p
	}, actor.WithSupervisor(resumeOnPanic), mb.props(), actor.WithDispatcher(s.cfg.dispatch))
	// A retiring actor may still hold its name: each gets its own.
	pid, err := s.root.SpawnNamed(props, "project/"+id+"#"+strconv.FormatUint(s.spawned, 10))
	if err != nil {
		panic("spawn project actor: " + err.Error()) // names are unique
	}
	ref.pid = pid
	s.projects.Store(id, ref)
}

// PublishWithin is Publish bounded by timeout (negative: by ctx alone). It
// is the HTTP emit's form: a timer per emit costs far less than a context
// with a deadline, which registers with its parent and allocates a dozen
// objects.
func (s *System) PublishWithin(ctx context.Context, timeout time.Duration, projectID, channel string, payload []byte) (PublishResult, error) {
	reply := make(chan PublishResult, 1)
	// The handler runs the project's and the channel's turns itself when they
	// are idle (mailbox.runHere): most emits are answered before tell returns.
	m := &Publish{Channel: channel, Payload: payload, At: s.cfg.Now(), Reply: reply, posterRuns: true}
	var deadline time.Time
	if timeout >= 0 {
		m.notAfter = m.At.Add(timeout - notAfterMargin)
		deadline = time.Now().Add(timeout) // from now: tell may run turns
	}
	s.tell(projectID, m)
	select {
	case r := <-reply:
		return r, nil
	default:
	}
	var expired <-chan time.Time
	if timeout >= 0 {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		expired = t.C
	}
	select {
	case r := <-reply:
		return r, nil
	case <-ctx.Done():
	case <-expired:
	}
	if m.abandon() {
		return PublishResult{}, ErrTimeout // and it will not be delivered
	}
	return <-reply, nil // taken just now: the answer is on its way
}

// notAfterMargin: a cluster's channel grain stops stamping an HTTP emit this
// long before its edge stops waiting, so that the answer of one it stamps
// has that long to come back (an emit answered 503 should not be delivered).
const notAfterMargin = time.Second

// Lease is one connection slot of a project, from one client address,
// taken by Reserve before a handshake is accepted and given back by Release.
type Lease struct {
	projectID string
	addr      *addrCount // nil when the address is not capped
	released  atomic.Bool
}

// addrCount is the live connections of one project from one client address;
// leases share it, so a connection holds no copy of the key.
type addrCount struct {
	key string // project id + client address
	n   int
}

// Reserve takes one of a project's connection slots before a handshake is
// accepted: false when MaxConnections are live (on this node, plus on the
// other members as they last said in a cluster), or
// MaxConnectionsPerAddress from this client address. addrKey names the
// client address the way the edge's limits group them (an IPv6 address by
// its /64). Open's Session gives it
// back on close; a handshake that fails after Reserve calls Release.
func (s *System) Reserve(projectID, addrKey string) (*Lease, bool) {
	s.liveMu.Lock()
	defer s.liveMu.Unlock()
	n := s.live[projectID]
	if s.cfg.MaxConnections > 0 && n+s.elsewhere[projectID] >= s.cfg.MaxConnections {
		return nil, false
	}
	l := &Lease{projectID: projectID}
	if s.cfg.MaxConnectionsPerAddress > 0 {
		key := projectID + "|" + addrKey
		a := s.byAddr[key]
		if a == nil {
			a = &addrCount{key: key}
			s.byAddr[key] = a
		}
		if a.n >= s.cfg.MaxConnectionsPerAddress {
			if a.n == 0 {
				delete(s.byAddr, key)
			}
			return nil, false
		}
		a.n++
		l.addr = a
	}
	s.live[projectID] = n + 1
	return l, true
}

// Release gives back a slot taken by Reserve; a second call does nothing.
func (s *System) Release(l *Lease) {
	if l == nil || l.released.Swap(true) {
		return
	}
	s.liveMu.Lock()
	defer s.liveMu.Unlock()
	decrement(s.live, l.projectID)
	if a := l.addr; a != nil {
		if a.n--; a.n <= 0 {
			delete(s.byAddr, a.key) // no entry stays per address ever seen
		}
	}
}

// decrement lowers a count, deleting it at zero: no entry stays per project
// ever seen.
func decrement(m map[string]int, k string) {
	if n := m[k]; n > 1 {
		m[k] = n - 1
	} else {
		delete(m, k)
	}
}

// OpenAuthorized is Open on a project whose channel authorization the
// handshake read as az (nil: off), with the identity of the connection's
// token (nil: none, or anonymous). az stands for the project's settings
// until its actor has loaded them.
func (s *System) OpenAuthorized(l *Lease, keyHash string, sink Sink, az *ProjectAuthz, id *Identity) *Session {
	h := s.authzOf(l.projectID) // every connection: the project may turn authorization on later
	if az != nil {
		h.seed(az)
	}
	project := s.tell(l.projectID, &connOpened{sink: sink, keyHash: keyHash, ident: id})
	pid := s.root.Spawn(s.connProps)
	s.root.Send(pid, &connInit{sink: sink, project: project, cfg: s.cfg, authz: h, ident: id}) // its first message
	return &Session{sys: s, sink: sink, pid: pid, lease: l, health: s.cfg.health.of(l.projectID)}
}

// KeysRevoked closes, on every running project actor that has them, the
// connections opened with these public keys (their hashes): a revoked or
// rotated key stops working at once, for live sockets too.
func (s *System) KeysRevoked(projectID string, keyHashes []string) {
	if len(keyHashes) > 0 {
		s.tellRunning(projectID, &keysRevoked{hashes: keyHashes})
	}
	// Other nodes also drop their cached keys.
	s.cluster.Load().broadcast(projectID, &clusterpb.Broadcast{Change: &clusterpb.Broadcast_KeysRevoked{
		KeysRevoked: &clusterpb.KeysRevoked{KeyHashes: keyHashes}}})
}

// CloseKeySockets closes this node's sockets of a project opened with these
// keys (4001), telling no other node: each node closes its own when a key's
// overlap window ends.
func (s *System) CloseKeySockets(projectID string, keyHashes []string) {
	if len(keyHashes) > 0 {
		s.tellRunning(projectID, &keysRevoked{hashes: keyHashes})
	}
}

// DrainUsage collects every running project's usage counters since the last
// drain (resetting them). Projects that do not answer before ctx ends keep
// their counts for the next drain.
func (s *System) DrainUsage(ctx context.Context) []Usage {
	var ids []string
	s.projects.Range(func(id, _ any) bool {
		ids = append(ids, id.(string))
		return true
	})
	reply := make(chan Usage, len(ids))
	asked := 0
	for _, id := range ids {
		if s.tellRunning(id, &usageDrain{reply: reply}) {
			asked++
		}
	}
	out := make([]Usage, 0, asked)
	for range asked {
		select {
		case u := <-reply:
			out = append(out, u)
		case <-ctx.Done():
			return out
		}
	}
	return out
}

// eachProject posts msg to every running project actor.
func (s *System) eachProject(msg edgeMessage) {
	s.projects.Range(func(id, _ any) bool {
		s.tellRunning(id.(string), msg)
		return true
	})
}

// ProjectDeleted closes the project's connections and stops its actors.
func (s *System) ProjectDeleted(id string) {
	s.tellRunning(id, &projectDeleted{})
	s.cfg.health.forget(id)
	s.cluster.Load().broadcast(id, &clusterpb.Broadcast{Change: &clusterpb.Broadcast_ProjectDeleted{
		ProjectDeleted: &clusterpb.ProjectDeleted{}}})
}

// Revoke applies stored revocations to a running project actor at once (a
// project actor started later loads them from the store).
func (s *System) Revoke(projectID string, revs []Revocation) {
	s.tellRunning(projectID, &revoked{revs: revs})
	if c := s.cluster.Load(); c != nil {
		c.broadcast(projectID, &clusterpb.Broadcast{Change: &clusterpb.Broadcast_TokensRevoked{
			TokensRevoked: &clusterpb.TokensRevoked{Revocations: revocationsToProto(revs)}}})
	}
}

// ClientEmitSecretChanged applies a new client-emit secret to a running
// project actor before the caller answers, so no token of the old secret
// passes afterwards.
func (s *System) ClientEmitSecretChanged(projectID, secret string) {
	s.tellRunning(projectID, &clientEmitSecret{secret: secret})
	s.cluster.Load().broadcast(projectID, &clusterpb.Broadcast{Change: &clusterpb.Broadcast_ClientEmitSecretChanged{
		ClientEmitSecretChanged: &clusterpb.ClientEmitSecretChanged{Secret: secret}}})
}

// AuthorizationChanged applies a project's new channel authorization on
// this node, and on the other members, before it returns: a subscribe or
// refresh after the change is judged by it on every node.
func (s *System) AuthorizationChanged(ctx context.Context, projectID string, az ProjectAuthz) {
	s.applyAuthorization(ctx, projectID, az)
	s.clusterAuthorizationChanged(projectID, az)
}

// applyAuthorization makes az this node's channel authorization of the
// project before it returns (or ctx ends): its running project actor takes
// it (a settings load under way predates it), else the holder its
// connections read (a starting actor loads the stored change).
func (s *System) applyAuthorization(ctx context.Context, projectID string, az ProjectAuthz) {
	done := make(chan struct{})
	if s.tellRunning(projectID, &authzChanged{az: &az, done: done}) {
		select {
		case <-done:
		case <-ctx.Done():
		}
		return
	}
	s.authzOf(projectID).cur.Store(&az)
}

// ReloadSettings makes this node's running project actor reload its
// settings, telling no other node: each reads the same stored change.
func (s *System) ReloadSettings(id string) { s.tellRunning(id, &settingsChanged{}) }

// ReloadAllSettings is ReloadSettings for every running project (changes
// this node could not read were pruned: which projects they touched is unknown).
func (s *System) ReloadAllSettings() {
	s.projects.Range(func(id, _ any) bool {
		s.ReloadSettings(id.(string))
		return true
	})
}

// AuthorizationOn says whether the project has channel authorization on,
// as this node's running project loaded it; known is false when no actor
// has (the caller reads the store).
func (s *System) AuthorizationOn(projectID string) (on, known bool) {
	v, ok := s.authz.Load(projectID)
	if !ok || !v.(*authzHolder).loaded.Load() {
		return false, false
	}
	return v.(*authzHolder).on() != nil, true
}

// HistoryOn says whether the project keeps channel history: never without
// a history store; else as its running actor on this node loaded it. known is false when no actor runs or it is still
// loading (the caller reads the store).
func (s *System) HistoryOn(ctx context.Context, projectID string) (on, known bool) {
	if s.cfg.History == nil {
		return false, true
	}
	reply := make(chan historyMode, 1)
	if !s.tellRunning(projectID, &historyModeAsk{reply: reply}) {
		return false, false
	}
	select {
	case m := <-reply:
		return m == historyOn, m != historyUnknown
	case <-ctx.Done():
		return false, false
	}
}

// SettingsChanged makes a running project actor reload its settings.
func (s *System) SettingsChanged(id string) {
	s.tellRunning(id, &settingsChanged{})
	s.cluster.Load().broadcast(id, &clusterpb.Broadcast{Change: &clusterpb.Broadcast_SettingsChanged{
		SettingsChanged: &clusterpb.SettingsChanged{}}})
}

// Shutdown stops every project actor (and with them their channels), letting
// each finish the messages already queued.
func (s *System) Shutdown(ctx context.Context) error {
	defer s.cfg.dispatch.stop() // last, and on every return: a turn scheduled after it gets a goroutine of its own
	var futures []*actor.Future
	s.projects.Range(func(_, ref any) bool {
		futures = append(futures, s.root.PoisonFuture(ref.(*projectRef).pid))
		return true
	})
	for _, f := range futures {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		_ = f.Wait()
	}
	if !s.as.IsStopped() { // leaving a cluster stops it
		s.as.Shutdown()
	}
	if s.cfg.historyWriter != nil {
		s.cfg.historyWriter.close()
	}
	s.cfg.jwks.close()
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
