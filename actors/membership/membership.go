// Package membership is the cluster's member list in etcd: protoactor's
// ClusterProvider, written for the relay instead of protoactor's own etcd
// provider, which loses events. That one lists the members, then watches for
// changes from whenever its watch starts, not from the list's revision: a
// node that registers or leaves in between (nodes started together) is
// missed for good, and two nodes can each own a channel. It also watches
// again after a failed watch without listing again, and its data is shared
// by goroutines without a lock.
//
// Here a member registers its key under a lease, lists the prefix, and
// watches from the list's revision plus one, so no event falls between the
// two; a watch that fails (its revision compacted, say) is followed by a
// fresh list, which replaces the member set whole. The keys and their JSON
// are the ones protoactor's provider writes, so nodes of either kind read
// each other (a rolling upgrade).
package membership

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/cluster"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Defaults of Config.
const (
	DefaultTTL = 3 * time.Second // the lease: a member that stops renewing it is dropped this long after
	retryEvery = time.Second     // a failed list or lease is tried again this often
	callBound  = 5 * time.Second // one etcd call
)

// Config is what New needs.
type Config struct {
	Client *clientv3.Client
	// Prefix holds one key per member: PREFIX + member id.
	Prefix string
	TTL    time.Duration
	// Lost is called once if this member's lease lapsed (its renewal found
	// the key gone): the others have dropped it. A key deleted otherwise
	// shows in the member list, without this member.
	Lost func(error)
	// Wire is the version of the messages between nodes this member
	// speaks, written in its registration (Node.Wire): a node sends a
	// message type added later only to members that speak it.
	Wire   int
	Logger *slog.Logger

	// Test hooks: listed runs between the list and the watch; renewal,
	// with true at each renewal of the lease, false when the renewals end.
	listed  func()
	renewal func(renewed bool)
}

// Provider registers one member and publishes the member list to protoactor.
type Provider struct {
	cfg  Config
	key  string
	self Node

	ctx     context.Context // ends at Shutdown
	stop    context.CancelFunc
	mu      sync.Mutex // Shutdown against itself
	stopped bool
	lostOne sync.Once
	publish func(cluster.Members) // protoactor's member list
	done    chan struct{}         // the watch has ended; nil until it starts
	wires   atomic.Pointer[map[string]int]
}

// Node is a member's registration, as protoactor's etcd provider writes it.
type Node struct {
	ID      string   `json:"id"`
	Name    string   `json:"name"`
	Host    string   `json:"host"`
	Address string   `json:"address"`
	Port    int      `json:"port"`
	Kinds   []string `json:"kinds"`
	Alive   bool     `json:"alive"`
	// Wire: the member's version of the messages between nodes (Config.Wire);
	// 0 for a member of a version before it was written.
	Wire int `json:"wire,omitempty"`
}

// Addr is the HOST:PORT the member's actor remote listens on.
func (n Node) Addr() string { return net.JoinHostPort(n.Host, strconv.Itoa(n.Port)) }

// ParseNode reads a registration ("" Host: not one).
func ParseNode(value []byte) (Node, error) {
	var n Node
	if err := json.Unmarshal(value, &n); err != nil {
		return Node{}, err
	}
	if n.Host == "" {
		n.Host = n.Address
	}
	if n.ID == "" || n.Host == "" {
		return Node{}, errors.New("a registration without an id or a host")
	}
	return n, nil
}

func (n Node) member() *cluster.Member {
	kinds := n.Kinds
	if kinds == nil {
		kinds = []string{}
	}
	return &cluster.Member{Id: n.ID, Host: n.Host, Port: int32(n.Port), Kinds: kinds}
}

// New makes a provider; protoactor's cluster starts it (StartMember).
func New(cfg Config) *Provider {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.Lost == nil {
		cfg.Lost = func(error) {}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ctx, stop := context.WithCancel(context.Background())
	return &Provider{cfg: cfg, ctx: ctx, stop: stop}
}

// StartMember registers this member (NAME@SYSTEM-ID, as protoactor's
// provider names it), publishes the member list and keeps both up to date.
func (p *Provider) StartMember(c *cluster.Cluster) error {
	host, portText, err := net.SplitHostPort(c.ActorSystem.Address())
	if err != nil {
		return err
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return fmt.Errorf("actor system address %q: %w", c.ActorSystem.Address(), err)
	}
	id := c.Config.Name + "@" + c.ActorSystem.ID
	self := Node{ID: id, Name: id, Host: host, Address: host, Port: port, Kinds: c.GetClusterKinds(), Alive: true, Wire: p.cfg.Wire}
	return p.start(self, c.MemberList.UpdateClusterTopology)
}

// StartClient is not used: every node is a member.
func (p *Provider) StartClient(*cluster.Cluster) error {
	return errors.New("membership: a client that is not a member is not supported")
}

// start registers self, lists the members, publishes them, and goes on
// beside the caller: the lease's renewal and the watch.
func (p *Provider) start(self Node, publish func(cluster.Members)) error {
	value, err := json.Marshal(self)
	if err != nil {
		return err
	}
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return errors.New("membership: shut down before it started")
	}
	p.self, p.key, p.publish = self, p.cfg.Prefix+self.ID, publish // Shutdown deletes the key from here on
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(p.ctx, callBound)
	defer cancel()
	lease, err := p.cfg.Client.Grant(ctx, int64(p.cfg.TTL/time.Second))
	if err != nil {
		return fmt.Errorf("etcd lease: %w", err)
	}
	// Renewed from now on: the rest of the start may take longer than the
	// lease on a loaded machine. The renewal ends with Shutdown, which a
	// failed start's caller runs.
	alive, err := p.cfg.Client.KeepAlive(p.ctx, lease.ID)
	if err != nil {
		return fmt.Errorf("etcd lease: %w", err)
	}
	put, err := p.cfg.Client.Put(ctx, p.key, string(value), clientv3.WithLease(lease.ID))
	if err != nil {
		return fmt.Errorf("register %s: %w", p.key, err)
	}
	go p.renew(alive, put.Header.Revision, string(value))
	members, rev, err := p.list(ctx)
	if err != nil {
		return err
	}
	p.mu.Lock() // no list published once Shutdown has begun
	if p.stopped {
		p.mu.Unlock()
		return errors.New("membership: shut down while starting")
	}
	p.publishMembers(members)
	p.mu.Unlock()
	if p.cfg.listed != nil {
		p.cfg.listed()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return errors.New("membership: shut down while starting")
	}
	p.done = make(chan struct{})
	go p.watch(members, rev)
	return nil
}

// list reads every registration and the revision it was read at.
func (p *Provider) list(ctx context.Context) (map[string]Node, int64, error) {
	resp, err := p.cfg.Client.Get(ctx, p.cfg.Prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, 0, fmt.Errorf("list the members: %w", err)
	}
	members := map[string]Node{}
	for _, kv := range resp.Kvs {
		if n, ok := p.read(kv.Key, kv.Value); ok {
			members[string(kv.Key)] = n
		}
	}
	return members, resp.Header.Revision, nil
}

// read parses a registration; one that does not parse is logged and left
// out (a newer version's, or not a member's).
func (p *Provider) read(key, value []byte) (Node, bool) {
	n, err := ParseNode(value)
	if err != nil {
		p.cfg.Logger.Warn("a key under the member prefix is not a member's registration: ignored", "key", string(key), "err", err)
		return Node{}, false
	}
	return n, true
}

func (p *Provider) publishMembers(members map[string]Node) {
	out := make(cluster.Members, 0, len(members))
	wires := make(map[string]int, len(members))
	for _, n := range members {
		out = append(out, n.member())
		if w, ok := wires[n.Addr()]; !ok || n.Wire < w {
			wires[n.Addr()] = n.Wire // two on one address (misconfigured): the older version decides
		}
	}
	p.wires.Store(&wires)
	p.publish(out)
}

// Wire is the wire version of the member at addr (HOST:PORT) in the latest
// member list; 0 when it is not listed or wrote none.
func (p *Provider) Wire(addr string) int {
	if w := p.wires.Load(); w != nil {
		return (*w)[addr]
	}
	return 0
}

// watch applies every change after rev to members and publishes the result;
// when the watch ends without Shutdown, it lists again and watches from there.
func (p *Provider) watch(members map[string]Node, rev int64) {
	defer close(p.done)
	for p.ctx.Err() == nil {
		// WithRequireLeader: an etcd member cut off from the others ends the
		// watch (ErrNoLeader) instead of leaving it silent; the list and
		// watch start again, on a member that has a leader.
		for resp := range p.cfg.Client.Watch(clientv3.WithRequireLeader(p.ctx), p.cfg.Prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
			if err := resp.Err(); err != nil {
				p.cfg.Logger.Warn("the member watch failed: listing the members again", "err", err)
				break
			}
			for _, ev := range resp.Events {
				key := string(ev.Kv.Key)
				if ev.Type == clientv3.EventTypeDelete {
					delete(members, key)
				} else if n, ok := p.read(ev.Kv.Key, ev.Kv.Value); ok {
					members[key] = n
				}
			}
			rev = resp.Header.Revision
			p.publishMembers(members)
		}
		for p.ctx.Err() == nil {
			ctx, cancel := context.WithTimeout(p.ctx, callBound)
			listed, listRev, err := p.list(ctx)
			cancel()
			if err == nil {
				members, rev = listed, listRev
				p.publishMembers(members)
				break
			}
			p.sleep(retryEvery)
		}
	}
}

// renew keeps the lease alive. When the renewal ends without Shutdown
// (etcd did not answer within the lease's time, so the client gave up on
// it), it leases the key again, once etcd answers, if the key is still this
// member's registration (created at created): an etcd that was down
// restores its leases, so the key is still there. A key that is gone
// lapsed: the others have dropped this member (Lost).
func (p *Provider) renew(alive <-chan *clientv3.LeaseKeepAliveResponse, created int64, value string) {
	for {
		for range alive {
			p.hook(true)
		}
		p.hook(false)
		if p.ctx.Err() != nil {
			return
		}
		for {
			p.sleep(retryEvery)
			if p.ctx.Err() != nil {
				return
			}
			lease, err := p.relet(created, value)
			if errors.Is(err, errLapsed) {
				p.lostOne.Do(func() { p.cfg.Lost(err) })
				return
			}
			if err == nil {
				if alive, err = p.cfg.Client.KeepAlive(p.ctx, lease); err == nil {
					break
				}
			}
			p.cfg.Logger.Warn("renewing this member's etcd registration failed: trying again", "err", err)
		}
	}
}

var errLapsed = errors.New("this member's etcd registration lapsed (its lease was not renewed in time): the other members have dropped it")

// relet puts the key under a new lease if it is still the registration
// created at created.
func (p *Provider) relet(created int64, value string) (clientv3.LeaseID, error) {
	ctx, cancel := context.WithTimeout(p.ctx, callBound)
	defer cancel()
	lease, err := p.cfg.Client.Grant(ctx, int64(p.cfg.TTL/time.Second))
	if err != nil {
		return 0, err
	}
	resp, err := p.cfg.Client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(p.key), "=", created)).
		Then(clientv3.OpPut(p.key, value, clientv3.WithLease(lease.ID))).
		Commit()
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		p.cfg.Client.Revoke(ctx, lease.ID)
		return 0, errLapsed
	}
	return lease.ID, nil
}

func (p *Provider) hook(renewed bool) {
	if p.cfg.renewal != nil {
		p.cfg.renewal(renewed)
	}
}

func (p *Provider) sleep(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-p.ctx.Done():
	}
}

// Shutdown deregisters this member (the others drop it at once) and stops
// watching; a second call does nothing.
func (p *Provider) Shutdown(bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return nil
	}
	p.stopped = true
	p.stop()
	if p.key == "" {
		return nil // never started
	}
	if p.done != nil {
		<-p.done // no list published after this
	}
	ctx, cancel := context.WithTimeout(context.Background(), callBound)
	defer cancel()
	for {
		_, err := p.cfg.Client.Delete(ctx, p.key)
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return fmt.Errorf("deregister %s: %w (%v)", strings.TrimPrefix(p.key, p.cfg.Prefix), ErrEtcdDown, err)
		case status.Code(err) != codes.Unavailable:
			return fmt.Errorf("deregister %s: %w", strings.TrimPrefix(p.key, p.cfg.Prefix), err)
		}
		// A connection that broke as etcd went away fails the delete at once
		// (the client does not send a change twice): ask again until etcd
		// answers or the bound is up.
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// ErrEtcdDown: Shutdown could not deregister, etcd not answering within its
// bound; the member's key goes when its lease runs out.
var ErrEtcdDown = errors.New("etcd did not answer")
