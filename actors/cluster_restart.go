package actors

import (
	"context"
	"fmt"
	"time"

	"github.com/relayhq/relay/actors/membership"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A node restarted on the address of one that crashed (a supervisor
// restarts it at once) must not join while that previous life is still
// registered: when the others drop it, its lease run out, protoactor ends
// every connection to its address, the new node's included, and the
// messages on them are lost (emits through the other nodes then failed for
// seconds after the new node was ready). So the node waits until no member
// is registered at its address, then a moment more for the others to take
// the removal in.

// previousLifeWait bounds the wait: the lease is 3 s. A member still there
// after it is alive: another node configured with the same address.
const previousLifeWait = 10 * time.Second

// dropSettle is the moment the others need to apply the removal they are
// told of (an etcd watch event), before this node starts listening.
const dropSettle = 500 * time.Millisecond

// memberPrefix is where the members register (actors/membership): the
// keys protoactor's etcd provider wrote, base key and cluster name, so that
// nodes of an older version read the same list.
func (c *Cluster) memberPrefix() string { return "/relay/" + c.name + "//" + c.name + "/" }

// awaitPreviousLife waits until no member is registered at addr.
func (c *Cluster) awaitPreviousLife(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), previousLifeWait)
	defer cancel()
	resp, err := c.etcd.Get(ctx, c.memberPrefix(), clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("list members: %w", err)
	}
	at := map[string]bool{} // keys of the members registered at addr
	for _, kv := range resp.Kvs {
		if memberAddr(kv.Value) == addr {
			at[string(kv.Key)] = true
		}
	}
	if len(at) == 0 {
		return nil
	}
	c.log.Info("a member is still registered at this node's address (its previous life?): joining once its lease runs out",
		"addr", addr, "members", len(at))
	began := time.Now()
	events := c.etcd.Watch(ctx, c.memberPrefix(), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	for len(at) > 0 {
		select {
		case wr, ok := <-events:
			if !ok || wr.Err() != nil {
				return fmt.Errorf("another member is registered at %s and still there after %v: two nodes with one RELAY_CLUSTER_ADDR? (%v)",
					addr, previousLifeWait, wr.Err())
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					delete(at, string(ev.Kv.Key))
				}
			}
		case <-ctx.Done():
			return fmt.Errorf("another member is registered at %s and still there after %v: two nodes with one RELAY_CLUSTER_ADDR?", addr, previousLifeWait)
		}
	}
	c.log.Info("the previous member at this node's address is gone", "addr", addr, "waited", time.Since(began).Round(time.Millisecond))
	time.Sleep(dropSettle)
	return nil
}

// memberAddr is the HOST:PORT a registration advertises ("" when it is not
// a member's registration).
func memberAddr(value []byte) string {
	n, err := membership.ParseNode(value)
	if err != nil {
		return ""
	}
	return n.Addr()
}
