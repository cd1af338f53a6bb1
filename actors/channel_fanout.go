package actors

import (
	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/transport"
)

// channelFanout is one node's sockets of a channel, and the only code that
// writes a channel's frames to them: the channel actor's on one node, the
// channel relay's on each node of a cluster. It holds no channel rule; the
// channel core decides, and this writes.
type channelFanout struct {
	name     string
	subs     subscribers
	counters *Counters
	usage    *projectUsage
}

func newChannelFanout(name string, cfg *Config, usage *projectUsage) channelFanout {
	return channelFanout{name: name, subs: newSubscribers(), counters: cfg.counters, usage: usage}
}

// channelSub is one socket's subscription.
type channelSub struct {
	sink     Sink
	presence bool
	clientID string
}

// deliver writes one stamped message (the same frame bytes) to every socket
// but skip, and returns the sockets found closed, which it drops: their
// connections are gone and unsubscribe on their own. accepted (unix ns) is
// when the emit was accepted, for latency; now is the fan-out's time.
func (f *channelFanout) deliver(frame []byte, skip uint64, accepted, now int64) (gone []uint64) {
	delivered := 0
	for i := 0; i < len(f.subs.list); {
		s := f.subs.list[i].sink
		if skip != 0 && s.ID() == skip {
			i++
			continue
		}
		if s.SendAt(frame, accepted) {
			delivered++
			i++
			continue
		}
		gone = append(gone, s.ID())
		f.subs.removeAt(i)
	}
	f.counters.Deliveries.Add(int64(delivered))
	if len(gone) > 0 {
		f.counters.Drops.Add(int64(len(gone)))
	}
	f.usage.health.fanout(delivered, len(gone), now)
	return gone
}

// subscribed sends a subscribe's answer to its socket (replay_gap, replay,
// ack, and for presence the sync) and adds the socket to the fan-out.
func (f *channelFanout) subscribed(m *subscribe, out *joinOutcome) {
	if out.gap {
		m.sink.Send(transport.TextFrame(proto.AppendReplayGap(nil, f.name, out.gapSince)))
	}
	for _, msg := range out.replay {
		m.sink.Send(transport.TextFrame(proto.AppendReplayed(nil, msg)))
	}
	f.subs.put(channelSub{sink: m.sink, presence: m.presence, clientID: m.clientID})
	m.sink.Send(transport.TextFrame(proto.AppendAck(nil, proto.ActionSubscribe, f.name)))
	if m.presence {
		members := out.members
		if members == nil {
			members = []string{}
		}
		m.sink.Send(transport.TextFrame(proto.AppendPresenceSync(nil, f.name, members)))
	}
}

// unsubscribed drops a socket, and acks unless it is gone (silent).
func (f *channelFanout) unsubscribed(m *unsubscribe) {
	f.subs.remove(m.connID)
	if !m.silent {
		m.sink.Send(transport.TextFrame(proto.AppendAck(nil, proto.ActionUnsubscribe, f.name)))
	}
}

// presence sends a join or leave to the presence subscribers but the
// socket it is about (except) and, with notSelf, but those subscribed under
// that clientId themselves (a roster difference).
func (f *channelFanout) presence(event, clientID string, except uint64, notSelf bool) {
	var frame []byte
	for _, s := range f.subs.list {
		if !s.presence || s.sink.ID() == except || (notSelf && s.clientID == clientID) {
			continue
		}
		if frame == nil {
			frame = transport.TextFrame(proto.AppendPresenceEvent(nil, f.name, event, clientID))
		}
		s.sink.Send(frame)
	}
}

// gap sends every socket a replay_gap since seq.
func (f *channelFanout) gap(since uint64) {
	if len(f.subs.list) == 0 {
		return
	}
	frame := transport.TextFrame(proto.AppendReplayGap(nil, f.name, float64(since)))
	for _, s := range f.subs.list {
		s.sink.Send(frame)
	}
}

// closeClient closes the sockets subscribed under clientID (a server-side
// disconnect) and returns them; they stay until their unsubscribe.
func (f *channelFanout) closeClient(clientID string) (closed []uint64) {
	for _, s := range f.subs.list {
		if s.clientID == clientID {
			s.sink.Close(proto.CloseClientDisconnected, closeReasonDisconnected)
			closed = append(closed, s.sink.ID())
		}
	}
	return closed
}

// subscribers are a channel's sockets on this node: a slice for the fan-out
// loop, indexed by connection id.
type subscribers struct {
	list  []channelSub
	index map[uint64]int // connection id → position in list
}

func newSubscribers() subscribers { return subscribers{index: map[uint64]int{}} }

// get returns the subscription of connection id.
func (s *subscribers) get(id uint64) (channelSub, bool) {
	i, ok := s.index[id]
	if !ok {
		return channelSub{}, false
	}
	return s.list[i], true
}

// put adds sub, or replaces the subscription of the same connection.
func (s *subscribers) put(sub channelSub) {
	id := sub.sink.ID()
	if i, ok := s.index[id]; ok {
		s.list[i] = sub
		return
	}
	s.index[id] = len(s.list)
	s.list = append(s.list, sub)
}

// removeAt drops list[i] by moving the last subscriber into its place, and
// returns it.
func (s *subscribers) removeAt(i int) channelSub {
	gone := s.list[i]
	delete(s.index, gone.sink.ID())
	last := len(s.list) - 1
	if i != last {
		s.list[i] = s.list[last]
		s.index[s.list[i].sink.ID()] = i
	}
	s.list[last] = channelSub{}
	s.list = s.list[:last]
	return gone
}

// remove drops the subscription of connection id, if any.
func (s *subscribers) remove(id uint64) (channelSub, bool) {
	i, ok := s.index[id]
	if !ok {
		return channelSub{}, false
	}
	return s.removeAt(i), true
}
