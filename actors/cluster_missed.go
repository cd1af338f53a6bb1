package actors

import (
	"context"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// protoactor's etcd provider lists the members, then watches for changes
// from whenever its watch starts, not from the list's revision: a member
// that registers in between (nodes started together) is missed until its
// key changes again, which it does not, and this node places grains
// without it, so two nodes can each own a channel. Seen with three nodes
// started together on a loaded machine: in 2 of 12 rounds one node listed
// two members for 20 s and more. With the gap widened to 1.5 s (a patched
// copy of the provider, to provoke it), 2 of 3 rounds missed a member for
// good; with the heal, each node listed all three within 7 s.
//
// healMissedMembers, at each etcd check (resp: the member keys it read),
// looks for members registered in etcd but missing from this node's list at
// this check and the one before (a registration not yet heard of is missing
// for milliseconds): it rewrites each such key as it is, same value and same lease, which every
// node's watch hears as a change, so the member is listed within two or
// three checks. missing holds the keys missing at the last check; the
// result, those missing at this one.
//
// A leaving node skips it: its provider's watch has stopped, so every node
// that joins meanwhile is missing from its list. Not healed: a member that
// deregisters in the same gap stays listed by the starting node until it
// leaves or restarts (a node started while another stops).
func (c *Cluster) healMissedMembers(ctx context.Context, resp *clientv3.GetResponse, missing map[string]bool) map[string]bool {
	if c.leaving.Load() {
		return nil
	}
	listed := map[string]bool{}
	for _, m := range c.view.Load().members {
		listed[m.ID] = true
	}
	now := map[string]bool{}
	for _, kv := range resp.Kvs {
		key := string(kv.Key)
		id := strings.TrimPrefix(key, c.memberPrefix())
		if listed[id] || id == c.self || c.pc.Remote.BlockList().IsBlocked(id) {
			continue // a member dropped once is blocked for good: it leaves when it finds out
		}
		now[key] = true
		if !missing[key] {
			continue
		}
		if _, err := c.etcd.Put(ctx, key, "", clientv3.WithIgnoreValue(), clientv3.WithIgnoreLease()); err != nil {
			c.log.Warn("a member registered in etcd is missing from this node's list, and rewriting its registration failed",
				"member", id, "address", memberAddr(kv.Value), "err", err)
			continue
		}
		c.log.Warn("a member registered in etcd was missing from this node's list: its registration is rewritten so that every node hears of it",
			"member", id, "address", memberAddr(kv.Value))
	}
	return now
}
