package actors

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/remote"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"

	"github.com/relayhq/relay/actors/clustertls"
	"github.com/relayhq/relay/actors/membership"
	"github.com/relayhq/relay/proto/clusterpb"
)

// Several nodes as one relay: membership through etcd (actors/membership,
// our own provider for protoactor's cluster), disthash identity lookup
// (cluster_placement.go); control-plane changes applied on every member
// before the API answers; channels as grains (cluster_channel_grain.go)
// that each node's relays (cluster_channel_relay.go) register with, so an emit made
// on any node reaches the subscribers of every node. Project actors are
// still per node, but what they count for the cluster is not: the project
// backstop and the per-clientId client-emit windows are the project grain's,
// lent to the nodes a share or a window at a time (cluster_project_budgets.go,
// cluster_client_holds.go), and the connection cap adds the other nodes'
// counts, shared each second (cluster_conns.go).

// wireVersion is the version of the messages between nodes this node speaks,
// written in its registration (membership.Node.Wire), so that a message
// type added in a version goes only to members that know it (a node drops
// a batch with a type it cannot name): 1 adds the holds of clientId windows
// (ClientRecall, ClientRelease; cluster_client_holds.go).
const wireVersion = 1

// speaks: the member at addr knows the messages of wire version v (this
// node does; so does every member of a test cluster without etcd).
func (c *Cluster) speaks(addr string, v int) bool {
	if c.provider == nil || addr == c.sys.as.Address() {
		return true
	}
	return c.provider.Wire(addr) >= v
}

// NodeActorName is the fixed name of the per-node actor every member runs:
// it applies the control-plane changes other members send it.
const NodeActorName = "relay-node"

// Defaults of ClusterConfig.
const (
	DefaultAckTimeout  = 2 * time.Second
	DefaultJoinTimeout = 15 * time.Second
	etcdProbeTimeout   = 5 * time.Second
	etcdCheckEvery     = 2 * time.Second
)

// ClusterConfig is what JoinCluster needs.
type ClusterConfig struct {
	Etcd []string // etcd client endpoints
	Addr string   // HOST:PORT the actor remote listens on and advertises
	Name string   // nodes with the same etcd and name form one cluster
	// TLS is the actor remote's mutual TLS: this node's certificate and
	// the cluster CA (cluster_wire.go). JoinCluster refuses nil unless Insecure.
	TLS      *clustertls.Credentials
	Insecure bool // a remote without TLS: loopback tests only
	// EtcdTLS (nil: plain TCP) and the etcd user, for our etcd client and
	// protoactor's provider alike.
	EtcdTLS                    *tls.Config
	EtcdUsername, EtcdPassword string
	// AckTimeout bounds how long a control-plane change waits for the other
	// members' acks; JoinTimeout bounds joining.
	AckTimeout  time.Duration
	JoinTimeout time.Duration
	// FirstSendDelay is a test hook: the first attempt of every publish to a
	// channel grain is held back this long, so that its retry arrives first
	// and the grain sees the first attempt as a duplicate. Zero in service.
	FirstSendDelay time.Duration
	// RemoteChange is called on this node once a change another member made
	// to a project has been applied to the local actors, before it is acked:
	// the wiring drops the project's cached keys there.
	RemoteChange func(projectID string)
	Logger       *slog.Logger
}

// Member is one node of the cluster as this node sees it.
type Member struct {
	ID      string `json:"id"`
	Address string `json:"address"`
	Self    bool   `json:"self"`
}

// ClusterView is the cluster part of /debug/actors.
type ClusterView struct {
	Name    string   `json:"name"`
	Self    string   `json:"self"`
	Members []Member `json:"members"`
	// Grains are the channel grains this node hosts (PROJECT_ID/CHANNEL, the
	// first 1 000 sorted), GrainsTotal how many.
	Grains      []string `json:"grains"`
	GrainsTotal int      `json:"grainsTotal"`
	// ProjectGrains are the project grains this node hosts (project ids,
	// the first 1 000 sorted).
	ProjectGrains []string `json:"projectGrains"`
}

// ClusterStats are the cluster's cumulative figures for metrics.
type ClusterStats struct {
	Members int
	EtcdUp  bool // etcd answered the last check (every 2 s)
	// BroadcastsSent counts control-plane changes sent to other members (one
	// per member per change), Acked those acknowledged within the bound,
	// TimedOut those that were not (no answer, or the member was gone).
	// Received counts changes from other members applied here.
	BroadcastsSent, BroadcastsAcked, BroadcastsTimedOut, BroadcastsReceived int64
	// Grains: channel grains running on this node; Activations: grains
	// (channel and project) started here since this node joined. CrossNode: channel messages this node
	// sent to another member. Duplicates: publishes a grain here answered
	// from memory instead of stamping again (retries). OwnerRefusals:
	// publishes a grain here refused because this node no longer owns the
	// channel. Retries: publishes this node sent again, unanswered.
	// ActivationRefusals: requests to start a grain here that another
	// member owns in this node's member list (placement).
	Grains                                                                         int64
	Activations, CrossNode, Duplicates, OwnerRefusals, Retries, ActivationRefusals int64
}

// Cluster is this node's membership. Its methods are safe for concurrent use.
type Cluster struct {
	sys          *System
	name         string
	self         string // member id: NAME@actor-system-id, as the etcd provider names it
	addr         string
	log          *slog.Logger
	ackTimeout   time.Duration
	remoteChange func(projectID string)
	node         *actor.PID

	pc       *cluster.Cluster // nil in tests that drive the node actor alone
	provider *membership.Provider
	etcd     *clientv3.Client // the start probe, the member list, watchEtcd
	etcdUp   atomic.Bool
	stop     chan struct{} // closed by Leave

	view         atomic.Pointer[memberView] // the latest member list, from the cluster's events
	joined       atomic.Bool                // this node has seen itself a member
	leaving      atomic.Bool                // HandOff or Leave began: a member list without this node is expected
	left         atomic.Bool                // Leave began
	deregistered atomic.Bool                // deregister has run (HandOff or Leave)
	lost         chan error                 // one error when this node finds itself out of the membership
	lostMu       sync.Once
	seq          atomic.Uint64

	sent, acked, timedOut, received atomic.Int64

	grains          sync.Map // identity → *actor.PID, of the channel grains running here
	projectGrains   sync.Map // project id → *actor.PID, of the project grains running here
	projectHandoffs sync.Map // project id → *handed: states handed to this node for project grains not started yet
	handoffs        sync.Map // identity → *handed: states handed to this node for grains not started yet
	moves           moves    // grains moving because a node joined (cluster_handoff.go)
	projectReplay   sync.Map // project id → *replayBudget: replay bytes of its grains here
	grainsLive      atomic.Int64
	firstSendDelay  time.Duration
	publishes       atomic.Uint64 // publish ids
	fence           pauseFence    // cluster_fence.go
	badContent      atomic.Int64  // peers' messages refused for their content (refuseContent)
	contentLogs     logLimit

	activations, crossNode, duplicates, ownerRefusals, retries, activationRefusals atomic.Int64
	place                                                                          *placement
}

// newCluster starts this node's node actor; JoinCluster adds the membership.
func (s *System) newCluster(cfg ClusterConfig) (*Cluster, error) {
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = DefaultAckTimeout
	}
	if cfg.RemoteChange == nil {
		cfg.RemoteChange = func(string) {}
	}
	if cfg.Logger == nil {
		cfg.Logger = s.cfg.Logger
	}
	c := &Cluster{
		sys: s, name: cfg.Name, self: cfg.Name + "@" + s.as.ID, addr: cfg.Addr, log: cfg.Logger,
		ackTimeout: cfg.AckTimeout, remoteChange: cfg.RemoteChange, lost: make(chan error, 1), stop: make(chan struct{}),
		firstSendDelay: cfg.FirstSendDelay,
	}
	c.view.Store(newMemberView(nil, c.self))
	c.etcdUp.Store(true)
	pid, err := s.root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return &nodeActor{c: c} },
		actor.WithSupervisor(resumeOnPanic)), NodeActorName)
	if err != nil {
		return nil, fmt.Errorf("start the node actor: %w", err)
	}
	c.node = pid
	return c, nil
}

// JoinCluster makes this node a member of the cluster found in etcd: it
// checks that etcd answers, starts the actor remote on cfg.Addr, registers
// in etcd and waits until it sees itself in the member list. From then on,
// the control-plane methods (ProjectDeleted, KeysRevoked, SettingsChanged,
// ClientEmitSecretChanged, Revoke) apply on every member before they return.
func (s *System) JoinCluster(cfg ClusterConfig) (*Cluster, error) {
	if cfg.JoinTimeout <= 0 {
		cfg.JoinTimeout = DefaultJoinTimeout
	}
	host, portText, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("cluster address %q: %w", cfg.Addr, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return nil, fmt.Errorf("cluster address %q: bad port", cfg.Addr)
	}
	guard := newRemoteGuard(cfg.Logger, s.as)
	if guard.log == nil {
		guard.log = s.cfg.Logger
	}
	remoteOpts, err := remoteOptions(cfg, guard)
	if err != nil {
		return nil, err
	}
	c, err := s.newCluster(cfg)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Cluster, error) {
		if c.provider != nil {
			c.provider.Shutdown(false) // deregisters, if it got that far
		}
		if c.etcd != nil {
			c.etcd.Close()
		}
		s.root.Stop(c.node)
		return nil, err
	}
	etcdCfg := clientv3.Config{
		Endpoints: cfg.Etcd, DialTimeout: etcdProbeTimeout, Logger: etcdLogger(c.log),
		TLS: etcdTLS(cfg), Username: cfg.EtcdUsername, Password: cfg.EtcdPassword,
		// gRPC's default reconnect backoff grows to 2 minutes: after an etcd
		// outage a client could come back later than its lease (3 s once
		// etcd is up again), and its node would lapse. Retry every second at most.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 200 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 2 * time.Second,
		})},
	}
	if c.etcd, err = clientv3.New(etcdCfg); err != nil {
		return fail(fmt.Errorf("etcd client: %w", err))
	}
	if err := probeEtcd(c.etcd, cfg.Etcd, c.memberPrefix()); err != nil {
		return fail(err)
	}
	if err := c.awaitPreviousLife(cfg.Addr); err != nil {
		return fail(fmt.Errorf("join cluster %q at %s: %w", cfg.Name, cfg.Addr, err))
	}
	c.provider = membership.New(membership.Config{Client: c.etcd, Prefix: c.memberPrefix(), Lost: c.lose, Wire: wireVersion, Logger: c.log})
	channelKind := cluster.NewKind(ChannelKind, actor.PropsFromProducer(func() actor.Actor { return newChannelGrain(c) },
		actor.WithSupervisor(resumeOnPanic)))
	projectKind := cluster.NewKind(ProjectKind, actor.PropsFromProducer(func() actor.Actor { return newProjectGrain(c) },
		actor.WithSupervisor(resumeOnPanic)))
	c.place = &placement{c: c}
	c.pc = cluster.New(s.as, cluster.Configure(cfg.Name, c.provider, c.place,
		// protoactor preallocates each peer's send queue at 1 000 000
		// slots (16 MB of heap per member, which also raises how much freed
		// memory the runtime keeps); the queue doubles when full, so start small.
		remote.Configure(host, port, append(remoteOpts, remote.WithAdvertisedHost(cfg.Addr), remote.WithEndpointWriterQueueSize(1024))...),
		cluster.WithKinds(channelKind, projectKind)))
	s.as.EventStream.Subscribe(func(evt any) {
		if t, ok := evt.(*cluster.ClusterTopology); ok {
			c.topology(t)
		}
	})
	started := make(chan error, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil { // protoactor panics when it cannot listen or register
				started <- fmt.Errorf("%v", r)
			}
		}()
		c.pc.StartMember() // sleeps 1 s once registered
		started <- nil
	}()
	select {
	case err = <-started:
	case <-time.After(cfg.JoinTimeout):
		err = fmt.Errorf("not a member after %v", cfg.JoinTimeout)
	}
	if err == nil && !c.joined.Load() {
		err = errors.New("registered, but this node is not in the member list")
	}
	if err != nil {
		// What protoactor started stays until the process exits, which it
		// does next; a registration it made lapses with its lease (3 s).
		return fail(fmt.Errorf("join cluster %q at %s: %w", cfg.Name, cfg.Addr, err))
	}
	if err := c.startFence(); err != nil {
		return fail(fmt.Errorf("join cluster %q at %s: read this node's registration: %w", cfg.Name, cfg.Addr, err))
	}
	go c.watchEtcd()
	go c.shareConnections()
	s.cluster.Store(c)
	return c, nil
}

// probeEtcd fails fast when no endpoint answers, or refuses to read the
// members (prefix): joining would wait for etcd for JoinTimeout.
func probeEtcd(cli *clientv3.Client, endpoints []string, prefix string) error {
	ctx, cancel := context.WithTimeout(context.Background(), etcdProbeTimeout)
	defer cancel()
	if _, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		// etcd answered, but its authentication refuses this node's user (or,
		// without one, the client certificate's CommonName).
		var coded interface{ Code() codes.Code }
		if errors.As(err, &coded) && (coded.Code() == codes.PermissionDenied || coded.Code() == codes.Unauthenticated) {
			return fmt.Errorf("etcd at %v refuses this node (etcd authentication: its user, or without one the client certificate's CommonName, needs read-write permission): %w", endpoints, err)
		}
		return fmt.Errorf("etcd at %v does not answer within %v: %w", endpoints, etcdProbeTimeout, err)
	}
	return nil
}

// watchEtcd asks etcd every etcdCheckEvery whether it answers, and logs when
// it stops and starts answering: while it does not, the membership is frozen
// (nodes neither join nor leave) and nothing else says so.
func (c *Cluster) watchEtcd() {
	t := time.NewTicker(etcdCheckEvery)
	defer t.Stop()
	var downSince time.Time
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), etcdProbeTimeout)
		_, err := c.etcd.Get(ctx, c.memberPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		cancel()
		switch {
		case err != nil && downSince.IsZero():
			downSince = time.Now()
			c.etcdUp.Store(false)
			c.log.Warn("etcd does not answer: the member list is frozen (no node can join, a node that dies stays listed); "+
				"serving and control-plane changes go on", "err", err)
		case err == nil && !downSince.IsZero():
			c.etcdUp.Store(true)
			c.log.Info("etcd answers again", "down_for", time.Since(downSince).Round(time.Second))
			downSince = time.Time{}
		}
	}
}

// topology records a new member list. Once this node has been a member, a
// list without it means its etcd registration lapsed (a lease not renewed
// in time): the other members have dropped it and block it from now on, so
// it must stop serving (Lost).
func (c *Cluster) topology(t *cluster.ClusterTopology) {
	old := c.view.Load()
	v := newMemberView(t.Members, c.self)
	c.view.Store(v)
	in := slices.ContainsFunc(v.members, func(m Member) bool { return m.Self })
	if c.joined.Load() {
		// First, while protoactor's placement actor has not heard of the
		// change yet (it subscribed to the event after this node did): the
		// grains that moved to a member that joined freeze before it stops them.
		c.moveOut(old, v, in)
		c.sys.eachProject(&topologyChanged{}) // their channel relays look their grains up again
	}
	ids := make(map[string]bool, len(v.members))
	for _, m := range v.members {
		ids[m.ID] = true
	}
	c.sys.root.Send(c.node, &membersChanged{ids: ids}) // a member gone: its connections are too
	switch {
	case in:
		if !c.joined.Load() {
			c.moves.joinedAt.Store(time.Now().UnixNano()) // before joined: stateComing reads them the other way round
			c.joined.Store(true)
		}
		c.recheckWaiting() // grains started before this node knew the member list
	case c.joined.Load() && !c.leaving.Load():
		c.lose(errors.New("this node is no longer in the cluster's member list (its etcd lease lapsed); the other members have dropped it"))
	}
}

func (c *Cluster) lose(err error) {
	c.lostMu.Do(func() {
		c.log.Error("cluster membership lost", "member", c.self, "err", err)
		c.lost <- err
	})
}

// Lost delivers one error if this node finds itself out of the membership:
// it should then drain and exit non-zero, so that a supervisor starts it
// again as a new member.
func (c *Cluster) Lost() <-chan error { return c.lost }

// memberView is one member list as this node saw it, and what is derived
// from it; a new list replaces the whole view at once.
type memberView struct {
	members []Member            // sorted by address
	raw     []*cluster.Member   // as protoactor gives them
	owners  *cluster.Rendezvous // which member owns a grain
	others  *cluster.Rendezvous // which member would own it without this node (HandOff; a joining node's grains)
}

func newMemberView(raw []*cluster.Member, self string) *memberView {
	v := &memberView{members: make([]Member, 0, len(raw)), raw: slices.Clone(raw), owners: cluster.NewRendezvous(), others: cluster.NewRendezvous()}
	var others []*cluster.Member
	for _, m := range raw {
		v.members = append(v.members, Member{ID: m.Id, Address: m.Address(), Self: m.Id == self})
		if m.Id != self {
			others = append(others, m)
		}
	}
	v.others.UpdateMembers(others)
	slices.SortFunc(v.members, func(a, b Member) int {
		return cmp.Or(cmp.Compare(a.Address, b.Address), cmp.Compare(a.ID, b.ID))
	})
	v.owners.UpdateMembers(raw)
	return v
}

// owns: this node owns the grain in the latest member list.
func (c *Cluster) owns(kind, identity string) bool {
	return c.ownerAddress(kind, identity) == c.sys.as.Address()
}

// ownerAddress is the address of the member that owns the grain in the
// latest member list.
func (c *Cluster) ownerAddress(kind, identity string) string {
	return c.view.Load().owners.GetByClusterIdentity(&cluster.ClusterIdentity{Kind: kind, Identity: identity})
}

// send posts a channel message, counting those that leave this node. A
// message that names a Ref goes with its sender, which the receiver checks
// against it (refsItsSender); the others (a delivery per message and
// relay) go without one.
func (c *Cluster) send(ctx actor.Context, to *actor.PID, msg any) {
	if to.Address != ctx.Self().Address {
		c.crossNode.Add(1)
	}
	if _, named := refOf(msg); named {
		ctx.Request(to, msg)
		return
	}
	ctx.Send(to, msg)
}

// replayBytes is the count of replay bytes held by a project's channel
// grains on this node (MAX_REPLAY_BYTES_PER_PROJECT applies per node).
func (c *Cluster) replayBytes(project string) *replayBudget {
	if v, ok := c.projectReplay.Load(project); ok {
		return v.(*replayBudget)
	}
	v, _ := c.projectReplay.LoadOrStore(project, &replayBudget{})
	return v.(*replayBudget)
}

// publishID is unique in the cluster: this member's id and a counter.
func (c *Cluster) publishID() string {
	return c.self + "#p" + strconv.FormatUint(c.publishes.Add(1), 10)
}

// Grains lists the identities of the channel grains running on this node
// (at most limit of them) and how many there are.
func (c *Cluster) Grains(limit int) ([]string, int) {
	var out []string
	c.grains.Range(func(k, _ any) bool {
		if len(out) < limit {
			out = append(out, k.(string))
		}
		return true
	})
	slices.Sort(out)
	return out, int(c.grainsLive.Load())
}

// Self is this node's member id.
func (c *Cluster) Self() string { return c.self }

// Members is the member list as this node last saw it, sorted by address.
func (c *Cluster) Members() []Member { return slices.Clone(c.view.Load().members) }

// View is the cluster part of /debug/actors.
func (c *Cluster) View() ClusterView {
	grains, total := c.Grains(1000)
	if grains == nil {
		grains = []string{}
	}
	projects := []string{}
	c.projectGrains.Range(func(k, _ any) bool {
		projects = append(projects, k.(string))
		return true
	})
	slices.Sort(projects)
	return ClusterView{Name: c.name, Self: c.self, Members: c.Members(), Grains: grains, GrainsTotal: total,
		ProjectGrains: projects[:min(len(projects), 1000)]}
}

// Stats are the cluster's counters.
func (c *Cluster) Stats() ClusterStats {
	return ClusterStats{
		Members: len(c.view.Load().members), EtcdUp: c.etcdUp.Load(), BroadcastsSent: c.sent.Load(), BroadcastsAcked: c.acked.Load(),
		BroadcastsTimedOut: c.timedOut.Load(), BroadcastsReceived: c.received.Load(),
		Grains: c.grainsLive.Load(), Activations: c.activations.Load(), CrossNode: c.crossNode.Load(),
		Duplicates: c.duplicates.Load(), OwnerRefusals: c.ownerRefusals.Load(), Retries: c.retries.Load(),
		ActivationRefusals: c.activationRefusals.Load(),
	}
}

// ErrLeaveTimeout: Leave gave up after leaveTimeout, etcd not answering.
var ErrLeaveTimeout = errors.New("not deregistered from etcd in time: the other members drop this node when its lease runs out (3 s after etcd answers)")

// leaveTimeout bounds deregistering, which waits for etcd.
const leaveTimeout = 5 * time.Second

// Leave deregisters from etcd first (unless HandOff has), so the other
// members drop this node at once, then stops the cluster (gossip, the actor
// remote). Call it after the API has stopped answering (a change made after
// leaving would reach no other node) and before System.Shutdown. With etcd
// down it gives up deregistering after 5 s (ErrLeaveTimeout).
func (c *Cluster) Leave(ctx context.Context) error {
	if c.pc == nil || c.left.Swap(true) {
		return nil
	}
	c.leaving.Store(true)
	close(c.stop)
	err := c.deregister(ctx)
	stopped := bounded(ctx, clusterStopTimeout, func() error {
		c.pc.Shutdown(true) // sleeps 2 s; grains still here (not handed off) stop
		c.etcd.Close()
		return nil
	})
	if err == nil && stopped != nil {
		err = fmt.Errorf("stop the cluster: %w", stopped)
	}
	return err
}

// clusterStopTimeout bounds stopping protoactor's cluster (it sleeps 2 s).
const clusterStopTimeout = 3 * time.Second

// deregister removes this node from etcd, once (bounded by leaveTimeout):
// the other members drop it at once.
func (c *Cluster) deregister(ctx context.Context) error {
	if c.deregistered.Swap(true) {
		return nil
	}
	err := bounded(ctx, leaveTimeout, func() error { return c.provider.Shutdown(true) })
	if errors.Is(err, membership.ErrEtcdDown) {
		err = ErrLeaveTimeout
	}
	if err != nil && !errors.Is(err, ErrLeaveTimeout) && !errors.Is(err, ctx.Err()) {
		err = fmt.Errorf("deregister from etcd: %w", err)
	}
	return err
}

// bounded runs f beside the caller and waits for it at most d (then
// ErrLeaveTimeout) or until ctx ends; f goes on by itself after that.
func bounded(ctx context.Context, d time.Duration, f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return ErrLeaveTimeout
	case <-ctx.Done():
		return ctx.Err()
	}
}

// peers are the members a change must reach: every member but this node.
// A member at this node's own address is this node's previous life (killed
// before it could deregister, its lease not yet run out): it is skipped.
func (c *Cluster) peers() []*actor.PID {
	var out []*actor.PID
	for _, m := range c.view.Load().members {
		if m.ID != c.self && m.Address != c.addr {
			out = append(out, actor.NewPID(m.Address, NodeActorName))
		}
	}
	return out
}

// broadcast sends a change made through this node to every other member and
// waits, at most AckTimeout, for their acks. A member that does not answer
// in time is logged and counted (relay_cluster_broadcasts_timed_out_total);
// the change is stored, so that member's project actors load it when they
// next start. Nothing happens on one node (c nil).
func (c *Cluster) broadcast(projectID string, b *clusterpb.Broadcast) {
	if c == nil || c.leaving.Load() {
		return
	}
	c.broadcastTo(c.peers(), projectID, b, nil)
}

// broadcastTo is broadcast to given node actors: how many acked, the sum of
// the acks' closed counts (ClientDisconnect), each ack handed to collect
// (nil: none) on the caller's goroutine.
func (c *Cluster) broadcastTo(targets []*actor.PID, projectID string, b *clusterpb.Broadcast, collect func(*clusterpb.BroadcastAck)) (acked, closed int) {
	if len(targets) == 0 {
		return 0, 0
	}
	b.Id = c.self + "#" + strconv.FormatUint(c.seq.Add(1), 10)
	b.Origin = c.self
	b.ProjectId = projectID
	// A collector actor sends the requests and hands each answer over: acks
	// come back as messages (no future, no lock), and one bound covers all.
	answers := make(chan any, len(targets))
	collector := c.sys.root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
		switch m := ctx.Message().(type) {
		case *actor.Started:
			for _, t := range targets {
				ctx.Request(t, b)
			}
		case *clusterpb.BroadcastAck, *actor.DeadLetterResponse:
			select {
			case answers <- m:
			default:
			}
		}
	}))
	defer c.sys.root.Stop(collector)
	// A query is not a change: the control-plane figures
	// (relay_cluster_broadcasts_*) count changes only.
	change := !isQuery(b)
	if change {
		c.sent.Add(int64(len(targets)))
	}
	ackedBy, failed := map[string]bool{}, 0
	deadline := time.NewTimer(c.ackTimeout)
	defer deadline.Stop()
wait:
	for len(ackedBy)+failed < len(targets) {
		select {
		case a := <-answers:
			if ack, ok := a.(*clusterpb.BroadcastAck); ok && ack.Id == b.Id {
				if !ackedBy[ack.Member] {
					closed += int(ack.Closed)
					if collect != nil {
						collect(ack)
					}
				}
				ackedBy[ack.Member] = true
			} else {
				failed++ // the member has no node actor (it is stopping)
			}
		case <-deadline.C:
			break wait
		}
	}
	if change {
		c.acked.Add(int64(len(ackedBy)))
	}
	if missing := len(targets) - len(ackedBy); missing > 0 {
		if change {
			c.timedOut.Add(int64(missing))
		}
		c.log.Warn("control-plane change not acknowledged by every member", "change", changeName(b), "project", projectID,
			"id", b.Id, "members", len(targets), "acked", len(ackedBy), "bound", c.ackTimeout)
	}
	return len(ackedBy), closed
}

// nodeActor applies the changes other members send, then acks them, and
// takes the grain states a leaving member hands over.
type nodeActor struct {
	c          *Cluster
	conns      remoteConns    // the other members' live connections per project
	early      []earlyHandoff // handoffs from members not listed here yet
	earlyBytes int            // their size
}

func (n *nodeActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *membersChanged, *earlyHandoffDue:
		n.takeEarlyHandoffs(ctx) // and a member list goes on to connsMessage
	case *clusterpb.GrainHandoff:
		n.takeHandoff(ctx, m)
		return
	}
	if n.connsMessage(ctx) {
		return
	}
	if q, ok := ctx.Message().(*clusterpb.ChannelQuery); ok {
		n.c.routeQuery(ctx, q)
		return
	}
	b, ok := ctx.Message().(*clusterpb.Broadcast)
	if !ok {
		return
	}
	if _, ok := b.Change.(*clusterpb.Broadcast_HealthQuery); ok {
		h := n.c.sys.healthHere(b.ProjectId)
		ctx.Respond(&clusterpb.BroadcastAck{Id: b.Id, Member: n.c.self, Health: &clusterpb.HealthFigures{
			MinuteCounts: h.Minute.counts[:], MinuteLatency: h.Minute.latency[:],
			HourCounts: h.Hour.counts[:], HourLatency: h.Hour.latency[:], Connections: int32(h.Connections),
		}})
		return
	}
	if _, ok := b.Change.(*clusterpb.Broadcast_OccupancyQuery); ok {
		// A query: answered beside Receive with this node's counts.
		sender, root, sys, ack, bound := ctx.Sender(), ctx.ActorSystem().Root, n.c.sys, &clusterpb.BroadcastAck{Id: b.Id, Member: n.c.self}, n.c.ackTimeout
		go func() {
			qctx, cancel := context.WithTimeout(context.Background(), bound)
			defer cancel()
			chans, _ := sys.occupancyHere(qctx, b.ProjectId)
			for _, c := range chans {
				ack.Channels = append(ack.Channels, &clusterpb.ChannelCount{Channel: c.Channel, Subscribers: int32(c.Subscribers)})
			}
			if sender != nil {
				root.Send(sender, ack)
			}
		}()
		return
	}
	n.c.received.Add(1)
	if d, ok := b.Change.(*clusterpb.Broadcast_ClientDisconnect); ok {
		// Acked once the sockets are closed: the sender answers its API
		// call only then. Asked beside Receive, which never waits.
		n.c.remoteChange(b.ProjectId)
		sender, root, sys, ack, bound := ctx.Sender(), ctx.ActorSystem().Root, n.c.sys, &clusterpb.BroadcastAck{Id: b.Id, Member: n.c.self}, n.c.ackTimeout
		go func() {
			qctx, cancel := context.WithTimeout(context.Background(), bound)
			defer cancel()
			closed, _ := sys.disconnectHere(qctx, b.ProjectId, d.ClientDisconnect.GetClientId())
			ack.Closed = int32(closed)
			if sender != nil {
				root.Send(sender, ack)
			}
		}()
		return
	}
	n.c.sys.applyRemote(b, n.c.log, n.c.ackTimeout)
	n.c.remoteChange(b.ProjectId)
	ctx.Respond(&clusterpb.BroadcastAck{Id: b.Id, Member: n.c.self})
}

// applyRemote applies a change made through another member to this node's
// running project actors, exactly as the local method does (without sending
// it on). A project with no actor here loads the stored change when it starts.
func (s *System) applyRemote(b *clusterpb.Broadcast, log *slog.Logger, bound time.Duration) {
	id := b.ProjectId
	switch ch := b.Change.(type) {
	case *clusterpb.Broadcast_AuthorizationChanged: // applied before the ack: connections check against it
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		s.applyAuthorization(ctx, id, authzFromProto(ch.AuthorizationChanged))
		cancel()
	case *clusterpb.Broadcast_ProjectDeleted:
		s.tellRunning(id, &projectDeleted{})
		s.cfg.health.forget(id)
	case *clusterpb.Broadcast_KeysRevoked:
		if h := ch.KeysRevoked.GetKeyHashes(); len(h) > 0 {
			s.tellRunning(id, &keysRevoked{hashes: h})
		}
	case *clusterpb.Broadcast_SettingsChanged:
		s.tellRunning(id, &settingsChanged{})
	case *clusterpb.Broadcast_ClientEmitSecretChanged:
		s.tellRunning(id, &clientEmitSecret{secret: ch.ClientEmitSecretChanged.GetSecret()})
	case *clusterpb.Broadcast_TokensRevoked:
		s.tellRunning(id, &revoked{revs: revocationsFromProto(ch.TokensRevoked.GetRevocations())})
	default: // a newer member's change this version does not know
		log.Warn("control-plane change of an unknown kind ignored", "id", b.Id, "from", b.Origin, "project", id)
	}
}

// isQuery: the broadcast asks each member for its figures and changes nothing.
func isQuery(b *clusterpb.Broadcast) bool {
	switch b.Change.(type) {
	case *clusterpb.Broadcast_OccupancyQuery, *clusterpb.Broadcast_HealthQuery:
		return true
	}
	return false
}

// changeName is the change's field name in the Broadcast oneof.
func changeName(b *clusterpb.Broadcast) string {
	m := b.ProtoReflect()
	if f := m.WhichOneof(m.Descriptor().Oneofs().ByName("change")); f != nil {
		return string(f.Name())
	}
	return "unknown"
}

func (s *System) clusterAuthorizationChanged(id string, az ProjectAuthz) {
	m := &clusterpb.AuthorizationChanged{On: az.On, Secrets: az.Secrets, JwksUrl: az.JWKSURL, PrivateChannels: az.Private}
	if !az.PreviousUntil.IsZero() {
		m.PreviousUntilUnixNano = az.PreviousUntil.UnixNano()
	}
	s.cluster.Load().broadcast(id, &clusterpb.Broadcast{Change: &clusterpb.Broadcast_AuthorizationChanged{AuthorizationChanged: m}})
}

func authzFromProto(m *clusterpb.AuthorizationChanged) ProjectAuthz {
	az := ProjectAuthz{On: m.GetOn(), Secrets: m.GetSecrets(), JWKSURL: m.GetJwksUrl(), Private: m.GetPrivateChannels()}
	if n := m.GetPreviousUntilUnixNano(); n != 0 {
		az.PreviousUntil = time.Unix(0, n)
	}
	return az
}

// clusterDisconnect asks every other member to close the clientId's sockets
// and returns how many they closed (0 on one node).
func (s *System) clusterDisconnect(id, clientID string) int {
	c := s.cluster.Load()
	if c == nil || c.leaving.Load() {
		return 0
	}
	_, closed := c.broadcastTo(c.peers(), id, &clusterpb.Broadcast{Change: &clusterpb.Broadcast_ClientDisconnect{
		ClientDisconnect: &clusterpb.ClientDisconnect{ClientId: clientID}}}, nil)
	return closed
}

func revocationsToProto(revs []Revocation) []*clusterpb.Revocation {
	out := make([]*clusterpb.Revocation, 0, len(revs))
	for _, r := range revs {
		out = append(out, &clusterpb.Revocation{Kind: r.Kind, Value: r.Value,
			RevokedAtUnixNano: r.RevokedAt.UnixNano(), ExpiresAtUnixNano: r.ExpiresAt.UnixNano()})
	}
	return out
}

func revocationsFromProto(in []*clusterpb.Revocation) []Revocation {
	out := make([]Revocation, 0, len(in))
	for _, r := range in {
		out = append(out, Revocation{Kind: r.Kind, Value: r.Value,
			RevokedAt: time.Unix(0, r.RevokedAtUnixNano).UTC(), ExpiresAt: time.Unix(0, r.ExpiresAtUnixNano).UTC()})
	}
	return out
}
