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
	// registration reads the member key's create revision from etcd (0: the
	// key is gone).
	registration func(context.Context) (int64, error)
}

// fenced: a grain here must not stamp now.
func (c *Cluster) fenced() bool {
	f := &c.fence
	if f.start.IsZero() {
		return false // not a member of an etcd cluster (tests that drive actors alone)
	}
	return f.fenced.Load() || time.Since(f.start)-time.Duration(f.last.Load()) > pauseLimit
}

// beat records a pulse at now (since start): paused when it came more than
// pauseLimit after the last, and the fence went up with it.
func (f *pauseFence) beat(now time.Duration) (gap time.Duration, paused bool) {
	gap = now - time.Duration(f.last.Load())
	if gap > pauseLimit { // up before the pulse time moves on: fenced() never sees neither
		paused = !f.fenced.Swap(true)
	}
	f.last.Store(int64(now))
	return gap, paused
}

// startFence records the registration just made and starts the pulse.
func (c *Cluster) startFence() error {
	key := c.memberPrefix() + c.self
	c.fence.registration = func(ctx context.Context) (int64, error) {
		resp, err := c.etcd.Get(ctx, key)
		if err != nil || len(resp.Kvs) == 0 {
			return 0, err
		}
		return resp.Kvs[0].CreateRevision, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), etcdProbeTimeout)
	defer cancel()
	rev, err := c.fence.registration(ctx)
	if err != nil {
		return err
	}
	if rev == 0 {
		return errors.New("registered, but etcd does not hold this node's key " + key)
	}
	c.fence.rev = rev
	c.fence.start = time.Now()
	go c.pulse()
	return nil
}

// pulse runs every pulseEvery; a late tick means the process was paused.
func (c *Cluster) pulse() {
	t := time.NewTicker(pulseEvery)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		if gap, paused := c.fence.beat(time.Since(c.fence.start)); paused {
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
		rev, err := c.fence.registration(ctx)
		cancel()
		switch {
		case err != nil:
			select {
			case <-c.stop:
				return
			case <-time.After(fenceRecheck):
			}
			continue
		case rev != c.fence.rev:
			c.lose(errors.New("this node was paused longer than its etcd lease; the other members have dropped it"))
			return
		}
		c.fence.fenced.Store(false)
		c.log.Info("membership confirmed after a pause: grains stamp again")
		return
	}
}
