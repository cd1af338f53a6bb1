package actors

import (
	"maps"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/relayhq/relay/proto/clusterpb"
)

// MAX_CONNECTIONS_PER_PROJECT counts the whole cluster: every node sends
// its live connection count of each project to the other members about
// once a second (only the counts that changed; every full-th time, all of
// them), and Reserve adds what the others last said to its own count. The
// tolerance: connections opened on other nodes in the last second or so are
// not seen yet, so a project can pass the cap by what the other nodes took
// in that time.

// connShareEvery is how often a node sends its counts; every connShareFull-th
// message lists every project (a member that missed one, or just joined,
// catches up).
const (
	connShareEvery = time.Second
	connShareFull  = 5
)

// shareConnections runs until Leave: it sends this node's counts to every
// other member's node actor.
func (c *Cluster) shareConnections() {
	t := time.NewTicker(connShareEvery)
	defer t.Stop()
	var sent map[string]int32 // as last sent
	// The node actor's PID at this member's address (c.node was spawned
	// before the remote started, at protoactor's "nonhost"): the receiver
	// checks that counts come from the member they name.
	from := actor.NewPID(c.sys.as.Address(), NodeActorName)
	for i := 0; ; i++ {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		now := c.sys.liveCounts()
		msg := &clusterpb.NodeConnections{Member: c.self, Full: i%connShareFull == 0, Counts: now}
		if !msg.Full {
			msg.Counts = map[string]int32{}
			for p, n := range now {
				if sent[p] != n {
					msg.Counts[p] = n
				}
			}
			for p := range sent {
				if _, ok := now[p]; !ok {
					msg.Counts[p] = 0
				}
			}
			if len(msg.Counts) == 0 {
				continue
			}
		}
		sent = now
		for _, to := range c.peers() {
			c.sys.root.RequestWithCustomSender(to, msg, from)
		}
	}
}

// liveCounts copies this node's live connection counts.
func (s *System) liveCounts() map[string]int32 {
	s.liveMu.Lock()
	defer s.liveMu.Unlock()
	out := make(map[string]int32, len(s.live))
	for p, n := range s.live {
		out[p] = int32(n)
	}
	return out
}

// remoteConns is the node actor's record of the other members' counts.
type remoteConns map[string]map[string]int32 // member id → project id → live connections

// take applies one member's message and returns the projects whose sum changed.
func (r remoteConns) take(m *clusterpb.NodeConnections) []string {
	old := r[m.Member]
	if m.Full {
		r[m.Member] = maps.Clone(m.Counts)
		changed := make([]string, 0, len(old)+len(m.Counts))
		for p := range old {
			changed = append(changed, p)
		}
		for p := range m.Counts {
			if _, ok := old[p]; !ok {
				changed = append(changed, p)
			}
		}
		return changed
	}
	if old == nil {
		old = map[string]int32{}
		r[m.Member] = old
	}
	changed := make([]string, 0, len(m.Counts))
	for p, n := range m.Counts {
		if n == 0 {
			delete(old, p)
		} else {
			old[p] = n
		}
		changed = append(changed, p)
	}
	return changed
}

// keep forgets the members not in ids and returns the projects they had.
func (r remoteConns) keep(ids map[string]bool) []string {
	var changed []string
	for member, counts := range r {
		if !ids[member] {
			for p := range counts {
				changed = append(changed, p)
			}
			delete(r, member)
		}
	}
	return changed
}

// sum is the other members' live connections of a project.
func (r remoteConns) sum(project string) int {
	n := 0
	for _, counts := range r {
		n += int(counts[project])
	}
	return n
}

// setElsewhere records the other members' sums for the projects named.
func (s *System) setElsewhere(r remoteConns, projects []string) {
	s.liveMu.Lock()
	defer s.liveMu.Unlock()
	for _, p := range projects {
		if n := r.sum(p); n > 0 {
			s.elsewhere[p] = n
		} else {
			delete(s.elsewhere, p)
		}
	}
}

// membersChanged tells the node actor the member ids of a new member list.
type membersChanged struct{ ids map[string]bool }

// connsMessage handles the node actor's part in the connection cap; false
// when msg is not about it.
func (n *nodeActor) connsMessage(ctx actor.Context) bool {
	if n.conns == nil {
		n.conns = remoteConns{}
	}
	switch m := ctx.Message().(type) {
	case *clusterpb.NodeConnections:
		if m.Member != n.c.self && n.c.sentByMember(ctx, m.Member) {
			n.c.sys.setElsewhere(n.conns, n.conns.take(m))
		}
	case *membersChanged:
		n.c.sys.setElsewhere(n.conns, n.conns.keep(m.ids))
	default:
		return false
	}
	return true
}

// connectionsElsewhere is a project's live connections on the other members.
func (s *System) connectionsElsewhere(project string) int {
	s.liveMu.Lock()
	defer s.liveMu.Unlock()
	return s.elsewhere[project]
}
