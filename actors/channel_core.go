package actors

import (
	"encoding/json"
	"slices"
	"time"

	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/transport"
)

// channelCore is one channel's rules, written once: seq, the replay ring,
// the channel's emit window, its subscribers by node and connection, the
// presence roster, the client-emit check that belongs to the channel
// (rule 4), the occupancy and member webhooks, and query answers. It is
// plain Go with no actor, network or clock of its own: the time comes with
// each call, and what it decides for sockets goes to each node's fan-out
// through out.
//
// On one node the channel actor hosts it, its own sockets the only node
// (localNode); in a cluster the channel's grain hosts it, with a node per
// relay. The host owns it: one goroutine at a time.
type channelCore struct {
	project, name string
	cfg           *Config // limits, counters, the webhook queue
	out           channelOutput

	seq uint64
	// fresh: seq is still the clock's start, told to nobody (nothing
	// stamped or handed over, no join answered with it): a channel that
	// keeps history may continue from its stored last seq (continueFrom).
	fresh bool
	// landed is the highest seq the channel delivered: here (land), by a
	// previous owner (merge), on a node (raise), or stored (continueFrom).
	// A relay is told no seq above it: a stamped message may still fail,
	// and a next owner after a crash may stamp that number again.
	landed   uint64
	window   fixedWindow
	replay   replayRing
	members  roster                        // presence subscriptions of every node, by clientId
	nodes    map[string]map[uint64]coreSub // subscribers by node and connection
	subCount int                           // subscribers of every node
	occupied bool                          // channel_occupied was the last occupancy said (or handed over)
	hooks    channelHooks                  // the project's channel and presence webhooks
}

// coreSub is one subscription as the channel knows it.
type coreSub struct {
	presence bool
	clientID string
}

// localNode names a single node's own sockets.
const localNode = ""

// channelOutput is the host's fan-out, for a stamped message and a
// presence event. Every node the core knows gets every presence event, so
// that each keeps the roster its sockets were told.
type channelOutput interface {
	// deliver hands m to every node with subscribers (c.nodes); gone counts
	// the sockets found closed while handing it over (none on a node whose
	// fan-out runs later).
	deliver(m *stamped) (gone int)
	// presence hands a join or leave to node's presence subscribers but
	// connection except (0: none).
	presence(node, event, clientID string, except uint64)
}

// stamped is one message the core stamped, as a fan-out needs it.
type stamped struct {
	seq       uint64
	buf       []byte // encodeMessage's frame buffer: transport.FramePayload(buf) is the message
	skipNode  string // a client emit's node and connection: the emitter gets the ack instead
	skipConn  uint64
	client    bool
	accepted  int64  // when the emit was accepted (unix ns), for latency
	publishID string // the cluster's id of the publish (empty on one node)
}

// newChannelCore starts a channel's life. seq starts from the clock (µs
// since the epoch, well inside 2^53), so it keeps rising when a dormant
// channel starts again and a client's `since` from before is older than
// anything buffered.
func newChannelCore(project, name string, cfg *Config, replayBytes *replayBudget, hooks channelHooks, out channelOutput) *channelCore {
	seq := uint64(cfg.Now().UnixMicro())
	return &channelCore{
		project: project, name: name, cfg: cfg, out: out, seq: seq, fresh: true, hooks: hooks,
		window: fixedWindow{size: time.Minute},
		replay: replayRing{ttl: cfg.ReplayTTL, maxBytes: cfg.ReplayMaxBytes, lowWater: seq,
			project: replayBytes, projectMax: int64(cfg.MaxReplayBytesPerProject)},
		members: newRoster(),
		nodes:   map[string]map[uint64]coreSub{},
	}
}

// emitRequest is one emit as the channel decides it.
type emitRequest struct {
	payload       []byte
	at            time.Time // the deciding clock's: windows must not move with the senders' clocks
	limit         int       // the channel's emits per minute
	projectDenied bool      // the project's window refused it first
	client        bool      // a client emit, from node's connection conn under clientID
	node          string
	conn          uint64
	clientID      string
	msgType       string
	accepted      int64
	publishID     string
}

// emitOutcome is the channel's answer to an emit. delivered counts the
// connections the message was handed to: every subscriber but the emitter,
// less those a fan-out found closed while handing it over (proto/PROTOCOL.md
// › POST /emit).
type emitOutcome struct {
	seq                    uint64
	subscribers, delivered int
	channel                Budget // not set for emit_identity_mismatch
	err                    proto.Code
}

// publish applies rule 4 and the windows, stamps seq, encodes the message
// once, keeps it for replay and hands it to every node with subscribers.
func (c *channelCore) publish(e *emitRequest) emitOutcome {
	m, res := c.stamp(e)
	if m == nil {
		return res
	}
	return c.land(m, e.at, res)
}

// stamp is publish's first half: rule 4, the windows, seq and the encoded
// message (nil when refused: res.err says why). A host that must store the
// message first (history.go) lands it once stored.
func (c *channelCore) stamp(e *emitRequest) (*stamped, emitOutcome) {
	if e.client && !c.emitterSubscribed(e.node, e.conn, e.clientID) {
		return nil, emitOutcome{err: proto.CodeEmitIdentityMismatch}
	}
	if e.projectDenied {
		c.cfg.counters.RateLimitedProject.Add(1)
		return nil, emitOutcome{channel: c.window.peek(e.at, e.limit), err: proto.CodeProjectRateLimited}
	}
	budget, ok := c.window.take(e.at, e.limit)
	if !ok {
		c.cfg.counters.RateLimitedChannel.Add(1)
		return nil, emitOutcome{channel: budget, err: proto.CodeChannelRateLimited}
	}
	c.seq++
	c.fresh = false
	buf := encodeMessage(c.name, e.payload, c.seq, e.client, e.msgType, e.clientID)
	m := &stamped{seq: c.seq, buf: buf, client: e.client, accepted: e.accepted, publishID: e.publishID}
	if e.client {
		m.skipNode, m.skipConn = e.node, e.conn
	}
	return m, emitOutcome{seq: c.seq, channel: budget}
}

// land is publish's second half: the stamped message m (accepted at at)
// goes into the ring and to every node with subscribers now.
func (c *channelCore) land(m *stamped, at time.Time, res emitOutcome) emitOutcome {
	c.landed = max(c.landed, m.seq)
	c.replay.add(m.seq, at, transport.FramePayload(m.buf))
	res.subscribers, res.delivered = c.subCount, c.subCount
	if m.client {
		res.delivered-- // rule 4: the emitter is a subscriber
	}
	if c.subCount > 0 {
		res.delivered -= c.out.deliver(m)
	}
	return res
}

// emitterSubscribed is client-emit rule 4 where subscriptions are decided:
// the emitting connection holds a presence subscription under the token's
// clientId. (Its connection checked its own record, which holds a presence
// subscribe from the moment it is sent, so one refused a moment ago passed
// there; the emit's per-clientId unit stays spent.)
func (c *channelCore) emitterSubscribed(node string, conn uint64, clientID string) bool {
	s, ok := c.nodes[node][conn]
	return ok && s.presence && s.clientID == clientID
}

// joinRequest is a subscribe from node's connection conn.
type joinRequest struct {
	node     string
	conn     uint64
	sub      coreSub
	hasSince bool
	since    float64
	stored   *storedReplay // what the store adds before the ring (history.go); nil: the ring alone
}

// joinOutcome is what the subscriber is sent, in this order: a replay_gap
// (gap), the replay, the ack, and for presence the sync (members). A refused
// subscribe sends only the error: the channel keeps what it had (kept, if
// subscribed).
type joinOutcome struct {
	refused    proto.Code
	kept       coreSub
	subscribed bool

	gap      bool
	gapSince float64
	replay   [][]byte // shared with the ring: send before the next change
	members  []string // the sync, for presence (a copy)
	seq      uint64
}

// join subscribes (or re-subscribes) a connection: the presence cap, the
// replay after since, a leave for a clientId it no longer holds, the
// occupancy webhook, the sync, and a join to every other presence
// subscriber.
func (c *channelCore) join(j *joinRequest, now time.Time) joinOutcome {
	subs := c.node(j.node)
	old, existed := subs[j.conn]
	wasMember := existed && old.presence
	same := wasMember && j.sub.presence && old.clientID == j.sub.clientID // a repeated subscribe
	if j.sub.presence && !same && c.members.full(j.sub.clientID, wasMember && c.members.only(old.clientID), c.cfg.MaxPresenceMembers) {
		return joinOutcome{refused: proto.CodeTooManyPresenceMembers, kept: old, subscribed: existed, seq: c.seq}
	}
	var out joinOutcome
	switch {
	case j.hasSince && j.stored != nil: // the store covers what the ring does not
		c.cfg.counters.ReplayRequests.Add(1)
		c.replay.expire(now)
		if out.gap, out.gapSince = j.stored.gap, j.since; out.gap {
			c.cfg.counters.ReplayGaps.Add(1)
		}
		out.replay = j.stored.msgs
		c.replay.each(j.since, func(_ uint64, msg []byte) { out.replay = append(out.replay, msg) })
	case j.hasSince:
		out.gap, out.gapSince = c.replay.request(j.since, now, c.cfg.counters), j.since
		c.replay.each(j.since, func(_ uint64, msg []byte) { out.replay = append(out.replay, msg) })
	}
	if wasMember && !same { // presence switched off, or a new clientId
		c.removeMember(old.clientID, j.node, j.conn)
	}
	subs[j.conn] = j.sub
	if !existed {
		c.subCount++
		c.occupiedNow()
	}
	if j.sub.presence {
		out.members = slices.Clone(c.members.others(j.sub.clientID, same))
		if !same {
			c.addMember(j.sub.clientID, j.node, j.conn)
		}
	}
	out.seq = c.seq
	return out
}

// leave drops one subscription: a presence leave when it was its
// clientId's last, channel_vacated when it was the channel's last.
func (c *channelCore) leave(node string, conn uint64) {
	sub, ok := c.nodes[node][conn]
	if !ok {
		return
	}
	delete(c.nodes[node], conn)
	c.subCount--
	if sub.presence {
		c.removeMember(sub.clientID, node, conn)
	}
	c.vacated()
}

// dropNode forgets a node (its relay stopped or its node is gone), each of
// its subscriptions leaving.
func (c *channelCore) dropNode(node string) {
	for conn := range c.nodes[node] {
		c.leave(node, conn)
	}
	delete(c.nodes, node)
}

// node returns node's subscriptions, adding the node when new.
func (c *channelCore) node(node string) map[uint64]coreSub {
	subs := c.nodes[node]
	if subs == nil {
		subs = map[uint64]coreSub{}
		c.nodes[node] = subs
	}
	return subs
}

// replaceNode takes a node's whole list of subscriptions (a relay that
// registers again), without join or leave events: what it brings is not
// new (a grain saw it join, perhaps one that crashed), and what it takes
// away left while the node was away. Webhooks: member_removed for the
// members it takes away, channel_vacated if it was the last. It reports
// whether the roster changed.
func (c *channelCore) replaceNode(node string, subs map[uint64]coreSub) (rosterChanged bool) {
	before := c.members.list()
	for _, s := range c.nodes[node] {
		if s.presence {
			c.members.remove(s.clientID)
		}
	}
	c.subCount -= len(c.nodes[node])
	delete(c.nodes, node)
	c.addNode(node, subs)
	if c.hooks.wantsPresence() {
		for _, id := range before {
			if c.members.counts[id] == 0 {
				c.hooks.member(c.cfg, c.project, c.name, id, false)
			}
		}
	}
	c.vacated()
	return !slices.Equal(before, c.members.sorted) // (nil and empty are equal)
}

// addNode records a node's subscriptions, counting their presence without
// join events (a register, or a handed-over state): the members are not new.
func (c *channelCore) addNode(node string, subs map[uint64]coreSub) {
	c.nodes[node] = subs
	c.subCount += len(subs)
	for _, s := range subs {
		if s.presence {
			c.members.add(s.clientID)
		}
	}
	if c.subCount > 0 {
		c.occupied = true // said before, by this channel's previous life
	}
}

func (c *channelCore) addMember(clientID, node string, conn uint64) {
	if c.members.add(clientID) {
		c.presenceEvent(proto.PresenceJoin, clientID, node, conn)
	}
}

func (c *channelCore) removeMember(clientID, node string, conn uint64) {
	if c.members.remove(clientID) {
		c.presenceEvent(proto.PresenceLeave, clientID, node, conn)
	}
}

// presenceEvent goes to the webhook and to every node, but not to the
// connection it is about.
func (c *channelCore) presenceEvent(event, clientID, from string, conn uint64) {
	c.hooks.member(c.cfg, c.project, c.name, clientID, event == proto.PresenceJoin)
	for node := range c.nodes {
		except := uint64(0)
		if node == from {
			except = conn
		}
		c.out.presence(node, event, clientID, except)
	}
}

func (c *channelCore) occupiedNow() {
	if c.subCount > 0 && !c.occupied {
		c.occupied = true
		c.hooks.occupancy(c.cfg, c.project, c.name, true)
	}
}

// vacated sends channel_vacated when the last subscriber of every node has
// left an occupied channel.
func (c *channelCore) vacated() {
	if c.subCount == 0 && c.occupied {
		c.occupied = false
		c.hooks.occupancy(c.cfg, c.project, c.name, false)
	}
}

// raise: a node delivered up to seq, past this core's (an owner that
// crashed stamped it): seq goes on from there, and what came before it is
// not in the ring.
func (c *channelCore) raise(seq uint64) {
	c.landed = max(c.landed, seq)
	if seq > c.seq {
		c.seq = seq
		c.replay.lowWater = max(c.replay.lowWater, seq)
	}
}

// continueFrom: the channel keeps history, and last is its stored last
// seq. A fresh core continues from there (or from what a node delivered, if
// higher): after a restart, a crash or a quiet spell, seq goes on with no
// jump. Every message a history channel delivered was stored first, so
// nothing delivered is above last. Any other core raises its seq to it.
func (c *channelCore) continueFrom(last uint64) {
	if !c.fresh || last == 0 {
		c.raise(last)
		return
	}
	c.landed = max(c.landed, last)
	c.seq, c.replay.lowWater, c.fresh = c.landed, c.landed, false
}

// merge takes a previous owner's state (a handoff): its ring goes before
// this one's (unless they could overlap: then a replay_gap is the honest
// answer), and its window counts with this one's. A fresh core goes on
// from the previous owner's seq (no jump on a handoff); any other keeps the
// higher. seq 0: the previous owner was fresh itself and knew of nothing
// delivered (handedSeq), and had nothing to hand on but its window. landed
// is the previous owner's (0: not said, by an older node: seq).
func (c *channelCore) merge(older []replayEntry, lowWater, seq, landed uint64, windowStart time.Time, windowCount int) {
	c.window.merge(windowStart, windowCount)
	if seq == 0 {
		return
	}
	if c.fresh {
		c.seq, c.replay.lowWater, c.fresh = seq, seq, false
	}
	c.replay.prepend(older, lowWater, seq, c.replay.empty() && c.replay.lowWater == c.seq)
	c.seq = max(c.seq, seq)
	if landed == 0 {
		landed = seq
	}
	c.raise(landed)
}

// handedSeq is the seq a handoff hands on: while fresh (the clock's start
// is no message's), only what a node said it delivered, if anything (0:
// the next owner keeps its own, or continues from the store).
func (c *channelCore) handedSeq() uint64 {
	if c.fresh {
		return c.landed
	}
	return c.seq
}

// bufferedMsg is one message of the ring.
type bufferedMsg struct {
	seq uint64
	msg []byte // shared with the ring
}

// after is what the ring holds above seq, and whether some of what followed
// seq is gone: what a node that last delivered seq missed.
func (c *channelCore) after(seq uint64, now time.Time) (gap bool, msgs []bufferedMsg) {
	c.replay.expire(now)
	if gap = c.replay.gapAfter(float64(seq)); gap {
		c.cfg.counters.ReplayGaps.Add(1)
	}
	c.replay.each(float64(seq), func(s uint64, msg []byte) { msgs = append(msgs, bufferedMsg{s, msg}) })
	return gap, msgs
}

// answer is the channel's answer to a query of every node's subscribers,
// the roster, or the ring after since (NoSince: all of it, no gap).
func (c *channelCore) answer(kind QueryKind, since uint64, now time.Time) ChannelAnswer {
	out := ChannelAnswer{Channel: c.name, Subscribers: c.subCount, MemberCount: c.members.len()}
	switch kind {
	case QueryMembers:
		out.Members = c.members.list()
	case QueryMessages:
		c.replay.expire(now)
		from := float64(0)
		if since != NoSince {
			from = float64(since)
			out.Gap = c.replay.gapAfter(from)
		}
		out.Messages = []json.RawMessage{}
		c.replay.each(from, func(_ uint64, msg []byte) { out.Messages = append(out.Messages, slices.Clone(msg)) })
	}
	return out
}

// idle: nobody listens and nothing is held that a fresh core would forget
// (the emit window has run out, the replay ring is empty).
func (c *channelCore) idle(now time.Time) bool {
	c.replay.expire(now)
	return c.subCount == 0 && c.window.idle(now) && c.replay.empty()
}
