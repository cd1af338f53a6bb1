package actors

import (
	"cmp"
	"encoding/json"
	"maps"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	gproto "google.golang.org/protobuf/proto"

	"github.com/relayhq/relay/proto"
	"github.com/relayhq/relay/proto/clusterpb"
	"github.com/relayhq/relay/transport"
)

// In a cluster a channel's project actor starts a channelRelay instead of a
// channelActor: it holds this node's subscribers of the channel and carries
// everything else to the channel's grain (cluster_channel_grain.go), wherever it
// runs. It receives each message once and writes the same bytes to its
// sockets.

// publishRetryAfter: a publish the grain has not answered by then is sent
// again with the same id (the grain answers a repeat without stamping it).
const publishRetryAfter = 300 * time.Millisecond

// clientEmitGiveUp: a client emit unanswered this long is refused
// service_unavailable (an HTTP emit ends with its edge's wait).
const clientEmitGiveUp = 5 * time.Second

type channelRelay struct {
	c    *Cluster
	cfg  *Config
	name string
	self *clusterpb.Ref

	grain grainLookup // the channel's grain

	fan    channelFanout   // this node's sockets
	roster map[string]bool // the cluster's members, as this node's presence subscribers were told
	// lastSeq is the highest seq this relay has seen: every message the grain
	// stamped up to it has been written to the sockets (or a replay_gap has
	// covered it). A message at or below it is one seen already.
	lastSeq uint64
	recent  answerMemory[uint64] // publish id → seq, of what this relay delivered in the last dedupeWindow (ChannelRegister.recent)

	ops      map[uint64][]relayOp // per socket: subscribes and unsubscribes whose local effect waits for the grain
	pending  map[string]*pendingPublish
	answers  map[uint64][]*pendingPublish // per socket: client emits and refusals, answered in the order they came
	retrying bool
	sent     uint64 // publishes taken, numbering pendingPublish.n

	usage     *projectUsage
	mailbox   *mailboxState
	processed uint64
	quiet     quietPeriod
}

// relayOp is a subscribe (with the join sent for it) or an unsubscribe.
type relayOp struct {
	sub   *subscribe
	join  *clusterpb.ChannelJoin
	unsub *unsubscribe
}

// pendingPublish is an emit sent to the grain and not yet answered, or a
// client-emit refusal waiting for its turn (done, with frame).
type pendingPublish struct {
	pub      *Publish
	msg      *clusterpb.ChannelPublish
	n        uint64 // the order it came in: resent in that order
	sentAt   time.Time
	attempts int
	done     bool
	frame    []byte
	sink     Sink
}

// topologyChanged: the member list changed; the grain may have moved.
type topologyChanged struct{}

func (*topologyChanged) fromEdge() {}

// retryTick drives publishRetryAfter.
type retryTick struct{}

func newChannelRelay(c *Cluster, projectID, channel string, cfg *Config, usage *projectUsage) *channelRelay {
	return &channelRelay{
		c: c, cfg: cfg, name: channel,
		grain: grainLookup{c: c, kind: ChannelKind, identity: projectID + "/" + channel},
		fan:   newChannelFanout(channel, cfg, usage), roster: map[string]bool{}, recent: newAnswerMemory[uint64](),
		ops: map[uint64][]relayOp{}, pending: map[string]*pendingPublish{}, answers: map[uint64][]*pendingPublish{},
		usage: usage,
	}
}

func (r *channelRelay) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		r.self = &clusterpb.Ref{Address: ctx.Self().Address, Id: ctx.Self().Id}
		scheduleQuietTick(ctx, r.cfg.ActorDormancy)
		r.grain.resolve(ctx)
	case *Publish:
		r.processed++
		r.publish(ctx, m)
	case *refuseEmit:
		r.processed++
		r.answer(&pendingPublish{done: true, sink: m.sink, frame: errorFrame(&proto.Error{Code: m.code, Channel: r.name})})
	case *subscribe:
		r.processed++
		r.subscribe(ctx, m)
	case *unsubscribe:
		r.processed++
		r.unsubscribe(ctx, m)
	case *topologyChanged:
		r.processed++
		r.grain.moved(ctx) // the channel may have a new owner
	case *actor.Stopping:
		r.grain.stop(ctx)
	case *resolveAgain:
		r.grain.retry(ctx, m)
	case *grainResolved:
		if r.grain.resolved(ctx, m) {
			r.registerAll(ctx)
		}
	case *actor.Terminated:
		r.grain.terminated(ctx, m.Who)
	case *clusterpb.ChannelDeliver:
		r.deliver(ctx, m)
	case *clusterpb.ChannelCatchUp:
		r.caughtUp(ctx, m)
	case *clusterpb.ChannelPublished:
		r.published(ctx, m)
	case *clusterpb.ChannelJoined:
		r.joined(ctx, m)
	case *clusterpb.ChannelPresence:
		r.presence(m)
	case *clusterpb.ChannelRoster:
		r.newRoster(m)
	case *retryTick:
		r.retrying = false
		r.retry(ctx)
	case *channelAsk:
		r.processed++
		r.answerQuery(m)
	case *inspectChannel:
		members := slices.Sorted(maps.Keys(r.roster)) // as a channel actor lists them
		if members == nil {
			members = []string{}
		}
		m.reply <- ChannelInfo{Name: r.name, Seq: r.lastSeq, Subscribers: len(r.fan.subs.list), PresenceMembers: members, Mailbox: r.mailbox.depth()}
	case *quietTick:
		scheduleQuietTick(ctx, r.cfg.ActorDormancy)
		if r.quiet.dormantAgain(len(r.fan.subs.list) == 0 && len(r.ops) == 0 && len(r.pending) == 0 && len(r.answers) == 0) {
			ctx.Send(ctx.Parent(), &mayStop{channel: r.name, processed: r.processed, pid: ctx.Self()})
		}
	}
}

// registerAll gives a grain new to the relay this node's whole state, then
// everything still unanswered again.
func (r *channelRelay) registerAll(ctx actor.Context) {
	reg := &clusterpb.ChannelRegister{Relay: r.self, LastSeq: r.lastSeq, Subs: make([]*clusterpb.Subscriber, 0, len(r.fan.subs.list))}
	r.recent.forget(r.cfg.Now())
	r.recent.each(func(id string, _ time.Time, seq uint64) {
		reg.Recent = append(reg.Recent, &clusterpb.RecentPublish{Id: id, Seq: seq})
	})
	for _, s := range r.fan.subs.list {
		reg.Subs = append(reg.Subs, &clusterpb.Subscriber{Conn: s.sink.ID(), Presence: s.presence, ClientId: s.clientID})
	}
	r.toGrain(ctx, reg)
	for _, ops := range r.ops {
		for _, op := range ops {
			if op.join != nil {
				r.toGrain(ctx, op.join)
			} else {
				r.toGrain(ctx, &clusterpb.ChannelLeave{Relay: r.self, Conns: []uint64{op.unsub.connID}})
			}
		}
	}
	for _, p := range r.inOrder() {
		r.sendPublish(ctx, p)
	}
}

// inOrder lists the pending publishes in the order they came, so that
// resent emits of one socket are stamped in the order it sent them.
func (r *channelRelay) inOrder() []*pendingPublish {
	out := make([]*pendingPublish, 0, len(r.pending))
	for _, p := range r.pending {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b *pendingPublish) int { return cmp.Compare(a.n, b.n) })
	return out
}

func (r *channelRelay) toGrain(ctx actor.Context, msg any) {
	if r.grain.pid != nil {
		r.c.send(ctx, r.grain.pid, msg)
	}
}

func (r *channelRelay) publish(ctx actor.Context, m *Publish) {
	if m.Reply != nil && m.abandoned() { // its edge answered 503: never send it
		refundProject(ctx, m)
		return
	}
	msg := &clusterpb.ChannelPublish{
		Id: r.c.publishID(), ReplyTo: r.self, Payload: m.Payload, AtUnixNano: m.At.UnixNano(),
		ChannelLimit: int32(m.channelLimit), ProjectDenied: m.projectDenied, History: m.history,
	}
	if m.origin != nil { // the relay answers service_unavailable at clientEmitGiveUp: never stamped after
		m.notAfter = m.At.Add(clientEmitGiveUp - notAfterMargin)
	}
	if !m.notAfter.IsZero() {
		msg.NotAfterUnixNano = m.notAfter.UnixNano()
	}
	r.sent++
	p := &pendingPublish{pub: m, msg: msg, n: r.sent}
	if m.origin != nil {
		msg.Client, msg.OriginConn, msg.ClientId, msg.MsgType = true, m.origin.ID(), m.clientID, m.msgType
		p.sink = m.origin
		id := p.sink.ID()
		r.answers[id] = append(r.answers[id], p)
	}
	r.pending[msg.Id] = p
	r.sendPublish(ctx, p)
	r.scheduleRetry(ctx)
}

// sendPublish sends (again) to the grain, once there is one.
func (r *channelRelay) sendPublish(ctx actor.Context, p *pendingPublish) {
	if r.grain.pid == nil {
		return // registerAll sends it
	}
	p.sentAt = r.cfg.Now()
	p.attempts++
	if p.attempts == 2 { // from now on a grain may have stamped it (ChannelPublish.resent); a copy: the first may still be read in this process
		p.msg = gproto.Clone(p.msg).(*clusterpb.ChannelPublish)
		p.msg.Resent = true
	}
	if d := r.c.firstSendDelay; d > 0 && p.attempts == 1 { // test hook: the first attempt arrives late
		grain, root, msg, self := r.grain.pid, ctx.ActorSystem().Root, p.msg, ctx.Self()
		time.AfterFunc(d, func() { root.RequestWithCustomSender(grain, msg, self) })
		return
	}
	if p.attempts > 1 {
		r.c.retries.Add(1)
	}
	r.c.send(ctx, r.grain.pid, p.msg)
}

func (r *channelRelay) scheduleRetry(ctx actor.Context) {
	if r.retrying || len(r.pending) == 0 {
		return
	}
	r.retrying = true
	sendLater(ctx, publishRetryAfter, &retryTick{})
}

// retry sends again what the grain has not answered, and gives up on what
// nobody waits for any more.
func (r *channelRelay) retry(ctx actor.Context) {
	now := r.cfg.Now()
	for _, p := range r.inOrder() {
		id := p.msg.Id
		switch {
		case p.pub.Reply != nil && p.pub.abandoned():
			delete(r.pending, id)
			refundProject(ctx, p.pub) // not stamped after its deadline (notAfter)
		case p.pub.Reply == nil && now.Sub(p.pub.At) > clientEmitGiveUp:
			delete(r.pending, id)
			refundProject(ctx, p.pub)
			p.done, p.frame = true, errorFrame(&proto.Error{Code: proto.CodeUnavailable, Channel: r.name})
			r.flushAnswers(p.sink.ID())
		case now.Sub(p.sentAt) >= publishRetryAfter:
			r.sendPublish(ctx, p)
		}
	}
	if r.grain.pid == nil && len(r.pending) > 0 {
		r.grain.resolveOnce(ctx)
	}
	r.scheduleRetry(ctx)
}

// published takes the grain's answer to a publish.
func (r *channelRelay) published(ctx actor.Context, m *clusterpb.ChannelPublished) {
	p, ok := r.pending[m.Id]
	if !ok {
		return // answered already (a retry's answer)
	}
	if m.Error == errNotOwner {
		// The grain moved or is handing off: look it up again (one lookup
		// at a time); the retry tick resends.
		r.grain.resolveOnce(ctx)
		return
	}
	delete(r.pending, m.Id)
	r.lastSeq = max(r.lastSeq, m.Seq)
	res := settleEmit(ctx, p.pub, r.usage, r.cfg.counters, grainCode(m.Error),
		PublishResult{Seq: m.Seq, Subscribers: int(m.Subscribers), Delivered: int(m.Delivered), Channel: budgetFromProto(m.Channel)})
	if p.pub.Reply != nil {
		if p.pub.take() {
			p.pub.Reply <- res
		}
		return
	}
	p.done, p.frame = true, emitAnswerFrame(r.name, res)
	r.flushAnswers(p.sink.ID())
}

// answer queues a client emit's answer behind that socket's earlier ones
// and sends what is ready.
func (r *channelRelay) answer(p *pendingPublish) {
	id := p.sink.ID()
	r.answers[id] = append(r.answers[id], p)
	r.flushAnswers(id)
}

// flushAnswers sends a socket's client-emit answers that are ready, in
// order. Each socket waits only for its own earlier emits.
func (r *channelRelay) flushAnswers(conn uint64) {
	q := r.answers[conn]
	n := 0
	for n < len(q) && q[n].done {
		q[n].sink.Send(q[n].frame)
		q[n] = nil
		n++
	}
	if n == len(q) {
		delete(r.answers, conn)
	} else if n > 0 {
		r.answers[conn] = append(q[:0], q[n:]...)
	}
}

// deliver writes one stamped message to this node's subscribers, unless it
// has seen it: a grain's catch-up, or a late message of a grain it left
// (one that froze and came back), whose seq is below its successor's.
func (r *channelRelay) deliver(ctx actor.Context, m *clusterpb.ChannelDeliver) {
	if m.Seq <= r.lastSeq {
		return
	}
	if !jsonObject(m.Message) { // written verbatim to every socket: a peer's bytes must not break a frame
		r.c.refuseContent("message", string(m.Message))
		return
	}
	r.lastSeq = m.Seq
	wall := r.cfg.Now()
	if m.PublishId != "" { // (a catch-up's messages have none: the grain sent them once already)
		r.recent.forget(wall)
		r.recent.remember(m.PublishId, wall, m.Seq)
	}
	// The emitting edge's clock: across nodes, latency is as good as their
	// clocks agree (0 from a member that sends no time: now).
	at := m.AcceptedUnixNano
	if at == 0 {
		at = wall.UnixNano()
	}
	if gone := r.fan.deliver(transport.TextFrame(m.Message), m.SkipConn, at, wall.UnixNano()); len(gone) > 0 {
		r.toGrain(ctx, &clusterpb.ChannelLeave{Relay: r.self, Conns: gone})
	}
}

// caughtUp takes a grain's answer to a register: a replay_gap to every
// subscriber when some of what followed the relay's last seq is gone, then
// what the relay missed, as live messages. The gap starts at the last seq
// the sockets got, which a late message of the previous grain may have
// raised past the one the register named.
func (r *channelRelay) caughtUp(ctx actor.Context, m *clusterpb.ChannelCatchUp) {
	if m.Gap {
		r.fan.gap(max(m.GapSince, r.lastSeq))
	}
	for _, d := range m.Messages {
		r.deliver(ctx, d)
	}
}

func (r *channelRelay) subscribe(ctx actor.Context, m *subscribe) {
	join := &clusterpb.ChannelJoin{Relay: r.self, Sub: &clusterpb.Subscriber{Conn: m.sink.ID(), Presence: m.presence, ClientId: m.clientID},
		HasSince: m.hasSince, Since: m.since}
	id := m.sink.ID()
	r.ops[id] = append(r.ops[id], relayOp{sub: m, join: join})
	r.toGrain(ctx, join)
}

func (r *channelRelay) unsubscribe(ctx actor.Context, m *unsubscribe) {
	r.toGrain(ctx, &clusterpb.ChannelLeave{Relay: r.self, Conns: []uint64{m.connID}})
	if len(r.ops[m.connID]) > 0 { // behind a subscribe still on its way
		r.ops[m.connID] = append(r.ops[m.connID], relayOp{unsub: m})
		return
	}
	r.fan.unsubscribed(m)
}

// joined applies a subscribe the grain answered: replay, ack, sync (the
// order of one node), then whatever waited behind it.
func (r *channelRelay) joined(ctx actor.Context, m *clusterpb.ChannelJoined) {
	ops := r.ops[m.Conn]
	if len(ops) == 0 || ops[0].sub == nil {
		return // a repeat answer after the grain moved
	}
	sub := ops[0].sub
	ops = ops[1:]
	r.lastSeq = max(r.lastSeq, m.Seq)
	if m.Refused != "" {
		kept, subscribed := r.fan.subs.get(m.Conn) // the grain keeps what it had, which the relay holds too
		sub.refuse(ctx, grainCode(m.Refused), kept, subscribed)
	} else {
		if sub.presence {
			// What this subscriber is told joins the relay's view (later
			// events come after this answer); a stale member in it leaves
			// with the next roster.
			for _, id := range m.Members {
				r.roster[id] = true
			}
			r.roster[sub.clientID] = true
		}
		replay := m.Replay
		for _, msg := range replay {
			if !jsonObject(msg) { // as deliver: a peer's bytes must not break a frame
				r.c.refuseContent("replayed message", string(msg))
				replay = slices.DeleteFunc(slices.Clone(replay), func(msg []byte) bool { return !jsonObject(msg) })
				break
			}
		}
		r.fan.subscribed(sub, &joinOutcome{gap: m.Gap, gapSince: m.GapSince, replay: replay, members: m.Members})
	}
	for len(ops) > 0 && ops[0].unsub != nil {
		r.fan.unsubscribed(ops[0].unsub)
		ops = ops[1:]
	}
	if len(ops) == 0 {
		delete(r.ops, m.Conn)
	} else {
		r.ops[m.Conn] = ops
	}
}

// presence passes a join or leave to this node's presence subscribers.
func (r *channelRelay) presence(m *clusterpb.ChannelPresence) {
	switch m.Event {
	case proto.PresenceJoin:
		r.roster[m.ClientId] = true
	case proto.PresenceLeave:
		delete(r.roster, m.ClientId)
	default: // written raw into the frame: only the two events a grain sends
		r.c.refuseContent("presence event", m.Event)
		return
	}
	r.fan.presence(m.Event, m.ClientId, m.ExceptConn, false)
}

// newRoster tells the presence subscribers how a fresh grain's member list
// differs from what they were told: members on a node that died leave.
func (r *channelRelay) newRoster(m *clusterpb.ChannelRoster) {
	now := make(map[string]bool, len(m.Members))
	for _, id := range m.Members {
		now[id] = true
		if !r.roster[id] {
			r.fan.presence(proto.PresenceJoin, id, 0, true)
		}
	}
	for id := range r.roster {
		if !now[id] {
			r.fan.presence(proto.PresenceLeave, id, 0, true)
		}
	}
	r.roster = now
}

// jsonObject: msg is one JSON object with nothing around it, as every
// message a grain stamps is (AppendReplayed replaces its last byte).
func jsonObject(msg []byte) bool {
	return len(msg) > 1 && msg[0] == '{' && msg[len(msg)-1] == '}' && json.Valid(msg)
}

// grainCode is a grain's answer as a code the edge may send ("": stamped):
// the errors a grain gives, else service_unavailable (expired: not stamped before
// the edge's deadline; anything else is written raw into a frame).
func grainCode(code string) proto.Code {
	switch c := proto.Code(code); c {
	case "", proto.CodeChannelRateLimited, proto.CodeProjectRateLimited, proto.CodeEmitIdentityMismatch,
		proto.CodeInvalidJSON, proto.CodeTooManyPresenceMembers:
		return c
	}
	return proto.CodeUnavailable
}
