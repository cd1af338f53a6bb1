package actors

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// A node that was frozen (SIGSTOP, a paused VM, a stall of the whole
// process) for longer than its etcd lease may have been dropped from the
// member list meanwhile, and its channels taken over by other nodes. When it
// runs again it still holds the old member list until etcd's events reach
// it, and its grains would go on stamping messages that reach only the
// relays still registered with them: a silent hole for every other node's
// subscribers. So a node that notices a pause fences its grains (they refuse
// to stamp, and the relays retry) until etcd says its registration is the
// one it made at join; if it is not, the node has been dropped and leaves.

const (
	pulseEvery = 100 * time.Millisecond
	// pauseLimit: a pulse later than this fences. The etcd lease lasts 3 s
	// and is renewed every second, so a shorter pause cannot have lost it.
	pauseLimit = time.Second
	// fenceRecheck: how soon a check that etcd did not answer is tried again.
	fenceRecheck = 500 * time.Millisecond
)

// pauseFence is the cluster's fence. Its fields are atomic: grains read it
// on every publish.
type pauseFence struct {
	start  time.Time    // the monotonic origin of last
	last   atomic.Int64 // when the pulse last ran, since start
	fenced atomic.Bool
	rev    int64 // the member key's create revision at join
}

// fenced: a grain here must not stamp now.
func (c *Cluster) fenced() bool {
	f := &c.fence
	if f.start.IsZero() {
		return false // not a member of an etcd cluster (tests that drive actors alone)
	}
	return f.fenced.Load() || time.Since(f.start)-time.Duration(f.last.Load()) > pauseLimit
}

// memberKey is this node's registration in etcd, as protoactor's provider
// writes it (base key, cluster name, member id).
func (c *Cluster) memberKey() string {
	return "/relay/" + c.name + "//" + c.name + "/" + c.self
}

// startFence records the registration just made and starts the pulse.
func (c *Cluster) startFence() error {
	ctx, cancel := context.WithTimeout(context.Background(), etcdProbeTimeout)
	defer cancel()
	resp, err := c.etcd.Get(ctx, c.memberKey())
	if err != nil {
		return err
	}
	if len(resp.Kvs) == 0 {
		return errors.New("registered, but etcd does not hold this node's key " + c.memberKey())
	}
	c.fence.rev = resp.Kvs[0].CreateRevision
	c.fence.start = time.Now()
	go c.pulse()
	return nil
}

// pulse runs every pulseEvery; a late tick means the process was paused.
func (c *Cluster) pulse() {
	t := time.NewTicker(pulseEvery)
	defer t.Stop()
	f := &c.fence
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		now := time.Since(f.start)
		gap := now - time.Duration(f.last.Swap(int64(now)))
		if gap > pauseLimit && !f.fenced.Swap(true) {
			c.log.Warn("this node was paused: its grains refuse to stamp until etcd confirms its membership", "paused", gap.Round(time.Millisecond))
			go c.liftFence()
		}
	}
}

// liftFence asks etcd whether this node's registration is still the one
// made at join, until it answers: yes lifts the fence; no means the lease
// lapsed during the pause and the others dropped this node, which must
// leave (Lost), its grains fenced for good.
func (c *Cluster) liftFence() {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), etcdProbeTimeout)
		resp, err := c.etcd.Get(ctx, c.memberKey())
		cancel()
		switch {
		case err != nil:
			select {
			case <-c.stop:
				return
			case <-time.After(fenceRecheck):
			}
			continue
		case len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != c.fence.rev:
			c.lose(errors.New("this node was paused longer than its etcd lease; the other members have dropped it"))
			return
		}
		c.fence.fenced.Store(false)
		c.log.Info("membership confirmed after a pause: grains stamp again")
		return
	}
}
