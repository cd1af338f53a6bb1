package actors

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/relayhq/relay/proto/clusterpb"
)

// Server-side queries and actions (proto/PROTOCOL.md › Server-side queries):
// the edge asks the project actor, which hands the question to one channel
// actor or to each of them, counting it as sent (so none stops with it in
// flight); each channel answers the edge directly on a channel made to hold
// every answer, so no actor ever waits. Nothing here touches the emit path.

// QueryKind is what a channel query asks for.
type QueryKind uint8

const (
	QueryCount      QueryKind = iota // subscribers and presence members
	QueryMembers                     // the presence clientIds
	QueryMessages                    // the replay ring after Since
	queryDisconnect                  // close the sockets of a clientId
)

// ChannelAnswer is one channel's answer to a query.
type ChannelAnswer struct {
	Channel     string
	Subscribers int
	MemberCount int
	Members     []string          // QueryMembers, sorted
	Messages    []json.RawMessage // QueryMessages, oldest first, as delivered
	Gap         bool              // QueryMessages: some of what followed Since is no longer buffered
	Closed      []uint64          // queryDisconnect: the connections closed
}

// NoSince is the since of a messages query that names none: every buffered
// message, and no gap (a since names a seq below 2^53).
const NoSince = ^uint64(0)

// channelQuery is the edge's question to a project actor: one channel
// (channel set) or every one.
type channelQuery struct {
	channel  string
	kind     QueryKind
	since    uint64
	clientID string
	reply    chan queryStarted // capacity 1
}

func (*channelQuery) fromEdge() {}

// queryStarted tells the edge how many channel answers to wait for, and where.
type queryStarted struct {
	n       int
	answers chan ChannelAnswer
}

// channelAsk is a query handed to one channel actor (or relay).
type channelAsk struct {
	q       *channelQuery
	answers chan ChannelAnswer // with room for every channel asked
}

func (a *projectActor) query(ctx actor.Context, m *channelQuery) {
	var targets []*childChannel
	if m.channel != "" {
		if c, ok := a.channels[m.channel]; ok {
			targets = append(targets, c)
		}
	} else {
		targets = make([]*childChannel, 0, len(a.channels))
		for _, c := range a.channels {
			targets = append(targets, c)
		}
	}
	answers := make(chan ChannelAnswer, len(targets))
	for _, c := range targets {
		c.sent++
		ctx.Send(c.pid, &channelAsk{q: m, answers: answers})
	}
	m.reply <- queryStarted{n: len(targets), answers: answers}
}

// closeReasonDisconnected goes with proto.CloseClientDisconnected.
const closeReasonDisconnected = "disconnected by the server"

func (a *channelActor) answerQuery(m *channelAsk) {
	q := m.q
	if q.kind != queryDisconnect {
		m.answers <- a.core.answer(q.kind, q.since, a.cfg.Now())
		return
	}
	closed := a.fan.closeClient(q.clientID)
	for _, conn := range closed { // their leaves go out now, before the edge answers
		a.fan.subs.remove(conn)
		a.core.leave(localNode, conn)
	}
	out := a.core.answer(QueryCount, 0, a.cfg.Now())
	out.Closed = closed
	m.answers <- out
}

// ask runs one query through the project actor and collects every channel's
// answer, waiting at most until ctx ends. A project with no running actor
// has no live channel: no answers.
func (s *System) ask(ctx context.Context, projectID string, q *channelQuery) ([]ChannelAnswer, error) {
	q.reply = make(chan queryStarted, 1)
	if !s.tellRunning(projectID, q) {
		return nil, nil
	}
	var st queryStarted
	select {
	case st = <-q.reply:
	case <-ctx.Done():
		return nil, ErrTimeout
	}
	out := make([]ChannelAnswer, 0, st.n)
	for range st.n {
		select {
		case a := <-st.answers:
			out = append(out, a)
		case <-ctx.Done():
			return out, ErrTimeout
		}
	}
	return out, nil
}

// Channel answers a query about one channel; a channel with no live state
// answers zeros (and no members or messages). In a cluster the channel's
// grain, its single writer, answers.
func (s *System) Channel(ctx context.Context, projectID, channel string, kind QueryKind, since uint64) (ChannelAnswer, error) {
	if c := s.cluster.Load(); c != nil {
		return c.askGrain(ctx, projectID, channel, kind, since)
	}
	answers, err := s.ask(ctx, projectID, &channelQuery{channel: channel, kind: kind, since: since})
	if err != nil {
		return ChannelAnswer{}, err
	}
	if len(answers) == 1 {
		return answers[0], nil
	}
	out := ChannelAnswer{Channel: channel}
	switch kind {
	case QueryMembers:
		out.Members = []string{}
	case QueryMessages:
		out.Messages = []json.RawMessage{}
	}
	return out, nil
}

// Occupancy lists the project's channels that have subscribers, sorted by
// name, with their subscriber counts.
func (s *System) Occupancy(ctx context.Context, projectID string) ([]ChannelAnswer, error) {
	here, err := s.occupancyHere(ctx, projectID)
	c := s.cluster.Load()
	if err != nil || c == nil || c.leaving.Load() {
		return here, err
	}
	// Every other member's sockets too, within the control-plane bound.
	sum := map[string]int{}
	for _, a := range here {
		sum[a.Channel] += a.Subscribers
	}
	c.broadcastTo(c.peers(), projectID, &clusterpb.Broadcast{Change: &clusterpb.Broadcast_OccupancyQuery{OccupancyQuery: &clusterpb.OccupancyQuery{}}},
		func(ack *clusterpb.BroadcastAck) {
			for _, ch := range ack.GetChannels() {
				sum[ch.GetChannel()] += int(ch.GetSubscribers())
			}
		})
	out := make([]ChannelAnswer, 0, len(sum))
	for name, n := range sum {
		out = append(out, ChannelAnswer{Channel: name, Subscribers: n})
	}
	slices.SortFunc(out, func(x, y ChannelAnswer) int { return strings.Compare(x.Channel, y.Channel) })
	return out, nil
}

// occupancyHere is Occupancy of this node's sockets.
func (s *System) occupancyHere(ctx context.Context, projectID string) ([]ChannelAnswer, error) {
	answers, err := s.ask(ctx, projectID, &channelQuery{kind: QueryCount})
	if err != nil {
		return nil, err
	}
	out := answers[:0]
	for _, a := range answers {
		if a.Subscribers > 0 {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, func(x, y ChannelAnswer) int { return strings.Compare(x.Channel, y.Channel) })
	return out, nil
}

// DisconnectClient closes, with proto.CloseClientDisconnected, every socket
// that holds a subscription under clientID, and returns how many it closed:
// on this node, and in a cluster on every other member that acks within the
// control-plane bound.
func (s *System) DisconnectClient(ctx context.Context, projectID, clientID string) (int, error) {
	n, err := s.disconnectHere(ctx, projectID, clientID)
	return n + s.clusterDisconnect(projectID, clientID), err
}

// disconnectHere is DisconnectClient on this node only.
func (s *System) disconnectHere(ctx context.Context, projectID, clientID string) (int, error) {
	answers, err := s.ask(ctx, projectID, &channelQuery{kind: queryDisconnect, clientID: clientID})
	closed := map[uint64]bool{}
	for _, a := range answers {
		for _, id := range a.Closed {
			closed[id] = true
		}
	}
	return len(closed), err
}

// answerQuery on a relay answers for this node's sockets only: a
// disconnect closes them (their unsubscribes reach the grain as each socket
// closes); the counts are this node's subscribers and the cluster's roster
// as this node was last told.
func (r *channelRelay) answerQuery(m *channelAsk) {
	q := m.q
	out := ChannelAnswer{Channel: r.name, Subscribers: len(r.fan.subs.list), MemberCount: len(r.roster)}
	switch q.kind {
	case QueryMembers:
		out.Members = slices.Sorted(maps.Keys(r.roster))
		if out.Members == nil {
			out.Members = []string{}
		}
	case QueryMessages:
		out.Messages = []json.RawMessage{}
	case queryDisconnect:
		out.Closed = r.fan.closeClient(q.clientID)
	}
	m.answers <- out
}

// askGrain asks the channel's grain through the node actor of the
// channel's owner (which answers zeros when no grain runs: a query starts
// none) and waits at most until ctx ends. The grain answers to a future, so
// a query it holds while it waits for its previous owner's state is
// answered after it.
func (c *Cluster) askGrain(ctx context.Context, projectID, channel string, kind QueryKind, since uint64) (ChannelAnswer, error) {
	identity := projectID + "/" + channel
	owner := c.ownerAddress(ChannelKind, identity)
	bound := time.Until(deadlineOf(ctx))
	if owner == "" || bound <= 0 {
		return ChannelAnswer{}, ErrTimeout
	}
	f := actor.NewFuture(c.sys.as, bound)
	c.sys.root.RequestWithCustomSender(actor.NewPID(owner, NodeActorName), &clusterpb.ChannelQuery{Kind: int32(kind), Since: since,
		Identity: identity, ReplyTo: &clusterpb.Ref{Address: f.PID().Address, Id: f.PID().Id}}, f.PID())
	res, err := f.Result()
	a, ok := res.(*clusterpb.ChannelQueryAnswer)
	if err != nil || !ok {
		return ChannelAnswer{}, ErrTimeout
	}
	out := ChannelAnswer{Channel: channel, Subscribers: int(a.Subscribers), MemberCount: int(a.MemberCount), Gap: a.Gap}
	switch kind {
	case QueryMembers:
		out.Members = a.Members
		if out.Members == nil {
			out.Members = []string{}
		}
	case QueryMessages:
		out.Messages = make([]json.RawMessage, len(a.Messages))
		for i, m := range a.Messages {
			out.Messages[i] = m
		}
	}
	return out, nil
}

// routeQuery is the owner's node actor handing a query to the channel's
// grain, or answering zeros when none runs here.
func (c *Cluster) routeQuery(ctx actor.Context, m *clusterpb.ChannelQuery) {
	if !c.refsItsSender(ctx, m) {
		return
	}
	if pid, ok := c.grains.Load(m.GetIdentity()); ok {
		ctx.Forward(pid.(*actor.PID)) // with its sender, which the grain checks too
		return
	}
	ctx.Send(actor.NewPID(m.ReplyTo.GetAddress(), m.ReplyTo.GetId()), &clusterpb.ChannelQueryAnswer{})
}

func deadlineOf(ctx context.Context) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return time.Now().Add(5 * time.Second)
}

// answerQuery is the grain's answer: every node's subscribers, the
// cluster's roster, the ring.
func (g *channelGrain) answerQuery(ctx actor.Context, m *clusterpb.ChannelQuery) {
	a := g.core.answer(QueryKind(m.Kind), m.Since, g.cfg.Now())
	out := &clusterpb.ChannelQueryAnswer{Subscribers: int32(a.Subscribers), MemberCount: int32(a.MemberCount), Members: a.Members, Gap: a.Gap}
	for _, msg := range a.Messages {
		out.Messages = append(out.Messages, msg)
	}
	ctx.Send(actor.NewPID(m.ReplyTo.GetAddress(), m.ReplyTo.GetId()), out)
}
