package membership

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/cluster"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/relayhq/relay/actors/membership/tempetcd"
)

// Each test has its own etcd (a real one: Debian's etcd-server), and runs
// beside the others: they check what the member list becomes, with bounds
// of seconds.

const prefix = "/relay/test//test/"

type fixture struct {
	t     *testing.T
	etcd  *tempetcd.Etcd
	cli   *clientv3.Client
	ctx   context.Context
	ports int // members started: each listens (as it says) on port 8000 + its number
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	e, err := tempetcd.Start(ctx, "relay-membership-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Stop)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return &fixture{t: t, etcd: e, cli: cli, ctx: ctx}
}

// register writes a registration for id, as another node would, under a
// lease of its own.
func (f *fixture) register(id string) {
	f.t.Helper()
	lease, err := f.cli.Grant(f.ctx, 60)
	if err != nil {
		f.t.Fatal(err)
	}
	value, _ := json.Marshal(Node{ID: id, Name: id, Host: "127.0.0.1", Address: "127.0.0.1", Port: 9000, Alive: true})
	if _, err := f.cli.Put(f.ctx, prefix+id, string(value), clientv3.WithLease(lease.ID)); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) deregister(id string) {
	f.t.Helper()
	if _, err := f.cli.Delete(f.ctx, prefix+id); err != nil {
		f.t.Fatal(err)
	}
}

// member is one provider under test and what it published.
type member struct {
	p    *Provider
	logs *syncBuffer
	lost chan error
	// renewed gets a token at each renewal of the lease, renewalsEnded
	// one when they end (etcd did not answer within the lease).
	renewed, renewalsEnded chan struct{}

	mu      sync.Mutex
	latest  []string      // member ids, sorted
	changed chan struct{} // closed at the next list published
}

func (m *member) renewal(renewed bool) {
	ch := m.renewalsEnded
	if renewed {
		ch = m.renewed
	}
	select {
	case ch <- struct{}{}:
	default:
	}
}

// await waits for n tokens on ch (at most 15 s); false when they did not come.
func await(ch <-chan struct{}, n int) bool {
	timeout := time.After(15 * time.Second)
	for range n {
		select {
		case <-ch:
		case <-timeout:
			return false
		}
	}
	return true
}

// start starts a provider for id; listed runs between its list and its watch.
func (f *fixture) start(id string, listed func(*member)) *member {
	f.t.Helper()
	m := &member{logs: &syncBuffer{}, lost: make(chan error, 1), changed: make(chan struct{}),
		renewed: make(chan struct{}, 64), renewalsEnded: make(chan struct{}, 8)}
	cfg := Config{Client: f.cli, Prefix: prefix, Logger: slog.New(slog.NewTextHandler(m.logs, nil)),
		Lost: func(err error) { m.lost <- err }, Wire: 7, renewal: m.renewal}
	if listed != nil {
		cfg.listed = func() { listed(m) }
	}
	m.p = New(cfg)
	f.ports++
	self := Node{ID: id, Name: id, Host: "127.0.0.1", Address: "127.0.0.1", Port: 8000 + f.ports, Kinds: []string{"channel"}, Alive: true, Wire: 7}
	if err := m.p.start(self, func(ms cluster.Members) {
		ids := make([]string, 0, len(ms))
		for _, x := range ms {
			ids = append(ids, x.Id)
		}
		slices.Sort(ids)
		m.mu.Lock()
		m.latest = ids
		close(m.changed)
		m.changed = make(chan struct{})
		m.mu.Unlock()
	}); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { m.p.Shutdown(true) })
	return m
}

// ids is the member list last published, and a channel closed at the next.
func (m *member) ids() ([]string, <-chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.latest, m.changed
}

// lists waits until the member lists exactly want (sorted), then checks
// that no other list follows within a moment (a silence: time by nature).
func (m *member) lists(t *testing.T, want ...string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		ids, changed := m.ids()
		if slices.Equal(ids, want) {
			select {
			case <-changed:
				if got, _ := m.ids(); !slices.Equal(got, want) {
					t.Fatalf("the member list became %v, want %v", got, want)
				}
			case <-time.After(300 * time.Millisecond):
			}
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("the member list is %v, want %v\nlogs:\n%s", ids, want, m.logs)
		}
	}
}

// A node that registers and one that leaves while this member starts (after
// its list, before its watch) are both seen: protoactor's provider missed
// both for good.
func TestNoChangeFallsBetweenListAndWatch(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.register("test@leaving")
	a := f.start("test@a", func(*member) {
		f.register("test@joining")
		f.deregister("test@leaving")
	})
	a.lists(t, "test@a", "test@joining")
}

// A watch that fails (here: its start revision compacted away) is followed
// by a fresh list, which replaces the member set whole.
func TestAFailedWatchListsAgain(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.register("test@leaving")
	a := f.start("test@a", func(*member) {
		f.register("test@joining")
		f.deregister("test@leaving")
		resp, err := f.cli.Get(f.ctx, "any")
		if err != nil {
			t.Error(err)
			return
		}
		if _, err := f.cli.Compact(f.ctx, resp.Header.Revision); err != nil {
			t.Error(err)
		}
	})
	a.lists(t, "test@a", "test@joining")
	if !strings.Contains(a.logs.String(), "listing the members again") {
		t.Errorf("the watch did not fail, so the test checked nothing; logs:\n%s", a.logs)
	}
	f.register("test@later") // the new watch works
	a.lists(t, "test@a", "test@joining", "test@later")
}

// A start slower than the lease (a loaded machine, an etcd slow to write)
// keeps its registration: the lease is renewed from its grant on. Here the
// start lasts until the lease has been renewed five times, a second apart
// (the client renews at a third of its 3 s), longer than the lease; with
// renewals only after the start it would never end.
func TestASlowStartKeepsItsLease(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a := f.start("test@a", func(m *member) {
		if !await(m.renewed, 5) {
			t.Error("the lease was not renewed during the start")
		}
	})
	created := f.key("test@a").CreateRevision
	select {
	case err := <-a.lost:
		t.Fatalf("lost after a slow start: %v", err)
	case <-time.After(2 * time.Second): // a lapse would be reported within a second or two
	}
	if f.key("test@a").CreateRevision != created {
		t.Fatal("the registration was made again")
	}
}

// Shutdown while the start is under way (a join that timed out) leaves no
// registration behind, and the start fails.
func TestShutdownDuringTheStart(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var p *Provider
	p = New(Config{Client: f.cli, Prefix: prefix, Logger: slog.New(slog.DiscardHandler), listed: func() {
		if err := p.Shutdown(true); err != nil {
			t.Error(err)
		}
	}})
	self := Node{ID: "test@a", Name: "test@a", Host: "127.0.0.1", Address: "127.0.0.1", Port: 8000, Alive: true}
	if err := p.start(self, func(cluster.Members) {}); err == nil {
		t.Fatal("a start that Shutdown interrupted succeeded")
	}
	if resp, err := f.cli.Get(f.ctx, prefix+"test@a"); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("the registration after Shutdown: %v %v", resp, err)
	}
}

// Members see each other come and go, and Shutdown deregisters at once.
func TestMembersSeeEachOther(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a := f.start("test@a", nil)
	b := f.start("test@b", nil)
	a.lists(t, "test@a", "test@b")
	b.lists(t, "test@a", "test@b")
	f.register("test@older") // a registration without a wire version, as an older node writes it
	a.lists(t, "test@a", "test@b", "test@older")
	if w, older := a.p.Wire("127.0.0.1:8002"), a.p.Wire("127.0.0.1:9000"); w != 7 || older != 0 {
		t.Fatalf("a reads b's wire version as %d and the older node's as %d, want 7 and 0", w, older)
	}
	f.deregister("test@older")
	if err := b.p.Shutdown(true); err != nil {
		t.Fatal(err)
	}
	if err := b.p.Shutdown(true); err != nil {
		t.Fatalf("a second Shutdown: %v", err)
	}
	a.lists(t, "test@a")
	if resp, err := f.cli.Get(f.ctx, prefix+"test@b"); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("b's key after Shutdown: %v %v", resp, err)
	}
}

// etcd down for longer than the lease, then back: the registration is still
// the one made at start (the fence compares its create revision), its lease
// renewed, the member not lost, and the watch goes on.
func TestAnEtcdOutageKeepsTheRegistration(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a := f.start("test@a", nil)
	before := f.key("test@a")
	f.etcd.Kill()
	if !await(a.renewalsEnded, 1) { // the client gives the lease up once it has had no answer for its TTL
		t.Fatal("the renewals did not end with etcd down")
	}
	if err := f.etcd.Restart(f.ctx); err != nil {
		t.Fatal(err)
	}
	f.register("test@b")
	a.lists(t, "test@a", "test@b")
	// Past the restored lease's own time: the key is kept by a live lease.
	select {
	case err := <-a.lost:
		t.Fatalf("lost: %v", err)
	case <-time.After(2 * DefaultTTL):
	}
	after := f.key("test@a")
	if after.CreateRevision != before.CreateRevision {
		t.Fatalf("the registration was made again (created at %d, then at %d)", before.CreateRevision, after.CreateRevision)
	}
}

// A registration that lapses (here: its lease revoked) means the others
// dropped this member: it is told so, and does not register again.
func TestALapsedRegistrationIsLost(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a := f.start("test@a", nil)
	if _, err := f.cli.Revoke(f.ctx, clientv3.LeaseID(f.key("test@a").Lease)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-a.lost:
		if !strings.Contains(err.Error(), "lapsed") {
			t.Fatalf("lost with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("not told it was lost; logs:\n%s", a.logs)
	}
	if resp, err := f.cli.Get(f.ctx, prefix+"test@a"); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("registered again: %v %v", resp, err)
	}
}

func (f *fixture) key(id string) *mvccKV {
	f.t.Helper()
	resp, err := f.cli.Get(f.ctx, prefix+id)
	if err != nil || len(resp.Kvs) != 1 {
		f.t.Fatalf("get %s: %v %v", id, resp, err)
	}
	return &mvccKV{CreateRevision: resp.Kvs[0].CreateRevision, Lease: resp.Kvs[0].Lease}
}

type mvccKV struct{ CreateRevision, Lease int64 }

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Shutdown with etcd gone cannot deregister: it asks again until its bound
// (a broken connection fails the delete at once) and says etcd is down, so
// that the node leaves as documented (its key goes with its lease).
func TestShutdownWithEtcdDown(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a := f.start("test@a", nil)
	f.etcd.Kill()
	began := time.Now()
	err := a.p.Shutdown(true)
	if !errors.Is(err, ErrEtcdDown) {
		t.Fatalf("Shutdown with etcd down: %v, want ErrEtcdDown", err)
	}
	if took := time.Since(began); took < callBound/2 {
		t.Fatalf("Shutdown gave up after %v, want it to ask again until its bound (%v)", took, callBound)
	}
}
