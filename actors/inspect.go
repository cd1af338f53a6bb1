package actors

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// Counters are the actor system's cumulative figures for metrics; actors add
// to them once per emit or event, never per delivery.
type Counters struct {
	EmittedHTTP, EmittedClient                                atomic.Int64
	Deliveries, Drops                                         atomic.Int64
	RateLimitedChannel, RateLimitedProject, RateLimitedClient atomic.Int64
	ReplayRequests, ReplayGaps                                atomic.Int64
	HistoryQueueFull                                          atomic.Int64 // history emits refused: the writer's queue was full
}

// ProjectInfo is a project actor's state for /debug/actors.
type ProjectInfo struct {
	ID                string        `json:"id"`
	Connections       int           `json:"connections"`
	ConnsElsewhere    int           `json:"connectionsOnOtherNodes,omitempty"` // in a cluster: what the connection cap adds, as last heard
	Channels          int           `json:"channels"`
	ConnectsUnrolled  int64         `json:"connectsSinceRollup"`
	EmitsUnrolled     int64         `json:"emitsSinceRollup"`
	Backstop          Budget        `json:"projectBudget"`
	ChannelRateLimit  int           `json:"channelRateLimit"`
	RevokedJTIs       int           `json:"revokedJtis"`
	RevokedClientIDs  int           `json:"revokedClientIds"`
	ClientEmitWindows int           `json:"clientEmitWindows"`
	ClientEmit        bool          `json:"clientEmitConfigured"`
	Webhook           bool          `json:"webhookConfigured"`
	WebhookEvents     []string      `json:"webhookEvents"` // opted in beyond connect and disconnect: "channel", "presence"
	Mailbox           int64         `json:"mailbox"`
	HeldEmits         int           `json:"heldEmits"` // emits waiting for the project's first settings load
	ChannelList       []ChannelInfo `json:"channelList,omitempty"`
	ChannelsTotal     int           `json:"channelsMatching,omitempty"`
}

// ChannelInfo is a channel actor's state for /debug/actors.
type ChannelInfo struct {
	Name            string   `json:"name"`
	Seq             uint64   `json:"seq"`
	Subscribers     int      `json:"subscribers"`
	PresenceMembers []string `json:"presenceMembers"`
	ReplayLen       int      `json:"replayLength"`
	ReplayBytes     int      `json:"replayBytes"`
	Window          Budget   `json:"channelBudget"`
	Mailbox         int64    `json:"mailbox"`
}

type inspectProject struct {
	channel string // name filter: exact, or prefix when it ends in *
	reply   chan inspectedProject
}

type inspectedProject struct {
	info     ProjectInfo
	channels map[string]*actor.PID
	limit    int
}

type inspectChannel struct {
	limit int
	reply chan ChannelInfo
}

func (a *projectActor) inspect(m *inspectProject) {
	now := a.cfg.Now()
	backstop := a.backstop.peek(now, a.cfg.ProjectRatePerMinute)
	if a.budgets != nil && a.budgets.lease.limit > 0 { // the cluster's, as this node's lease knows it
		backstop = a.budgets.lease.budget()
	}
	info := ProjectInfo{
		ID: a.id, Connections: len(a.conns), Channels: len(a.channels),
		ConnectsUnrolled: a.connects, EmitsUnrolled: a.usage.emits.Load(),
		Backstop: backstop, ChannelRateLimit: a.channelLimit(),
		RevokedJTIs: len(a.revokedJTIs), RevokedClientIDs: len(a.revokedClients), ClientEmitWindows: len(a.clientWindows),
		ClientEmit: a.settings.ClientEmitSecret != "", Webhook: a.settings.WebhookURL != "", Mailbox: a.mailbox.depth(),
		HeldEmits: len(a.heldEmits), WebhookEvents: []string{},
	}
	if c := a.cfg.cluster.Load(); c != nil {
		info.ConnsElsewhere = c.sys.connectionsElsewhere(a.id)
	}
	if t := a.hooks; t != nil {
		if t.channel {
			info.WebhookEvents = append(info.WebhookEvents, "channel")
		}
		if t.presence {
			info.WebhookEvents = append(info.WebhookEvents, "presence")
		}
	}
	channels := map[string]*actor.PID{}
	if m.channel != "" {
		for name, c := range a.channels {
			if matches(name, m.channel) {
				channels[name] = c.pid
			}
		}
	}
	m.reply <- inspectedProject{info: info, channels: channels, limit: info.ChannelRateLimit}
}

func matches(name, filter string) bool {
	if p, ok := strings.CutSuffix(filter, "*"); ok {
		return strings.HasPrefix(name, p)
	}
	return name == filter
}

func (a *channelActor) inspect(m *inspectChannel) {
	c, now := a.core, a.cfg.Now()
	c.replay.expire(now)
	m.reply <- ChannelInfo{
		Name: c.name, Seq: c.seq, Subscribers: c.subCount, PresenceMembers: c.members.list(),
		ReplayLen: len(c.replay.entries) - c.replay.head, ReplayBytes: c.replay.bytes,
		Window: c.window.peek(now, m.limit), Mailbox: a.mailbox.depth(),
	}
}

// Inspection is one page of the actor tree.
type Inspection struct {
	Projects      []ProjectInfo `json:"projects"`
	ProjectsTotal int           `json:"projectsMatching"`
	Offset        int           `json:"offset"`
	Limit         int           `json:"limit"`
	Cluster       *ClusterView  `json:"cluster,omitempty"` // the members, when this node is in a cluster
}

// Inspect pages through the running project actors (sorted by id; only
// project when it is set) and, when channel is set, lists their matching
// channels ("*" for all, "prefix*"), paged by the same offset and limit
// within each project. Everything is asked of the actors themselves.
func (s *System) Inspect(ctx context.Context, project, channel string, offset, limit int) (Inspection, error) {
	var ids []string
	s.projects.Range(func(id, _ any) bool {
		if project == "" || id.(string) == project {
			ids = append(ids, id.(string))
		}
		return true
	})
	slices.Sort(ids)
	out := Inspection{ProjectsTotal: len(ids), Offset: offset, Limit: limit, Projects: []ProjectInfo{}}
	if c := s.cluster.Load(); c != nil {
		v := c.View()
		out.Cluster = &v
	}
	chanOffset := 0
	if project == "" {
		ids = page(ids, offset, limit)
	} else {
		chanOffset = offset // one project: the page is over its channels
	}
	for _, id := range ids {
		reply := make(chan inspectedProject, 1)
		if !s.tellRunning(id, &inspectProject{channel: channel, reply: reply}) {
			continue // stopped meanwhile (dormant)
		}
		var p inspectedProject
		select {
		case p = <-reply:
		case <-ctx.Done():
			return out, ErrTimeout
		}
		if channel != "" {
			names := make([]string, 0, len(p.channels))
			for n := range p.channels {
				names = append(names, n)
			}
			slices.Sort(names)
			p.info.ChannelsTotal = len(names)
			if project == "" {
				names = page(names, 0, limit)
			} else {
				names = page(names, chanOffset, limit)
			}
			p.info.ChannelList = []ChannelInfo{}
			for _, n := range names {
				creply := make(chan ChannelInfo, 1)
				s.root.Send(p.channels[n], &inspectChannel{limit: p.limit, reply: creply})
				select {
				case ci := <-creply:
					p.info.ChannelList = append(p.info.ChannelList, ci)
				case <-ctx.Done():
					return out, ErrTimeout
				case <-time.After(200 * time.Millisecond):
					// the channel stopped meanwhile (dormant): skip it
				}
			}
		}
		out.Projects = append(out.Projects, p.info)
	}
	return out, nil
}

func page(s []string, offset, limit int) []string {
	if offset >= len(s) {
		return nil
	}
	s = s[offset:]
	if limit > 0 && limit < len(s) {
		s = s[:limit]
	}
	return s
}

// Counters exposes the system's counters.
func (s *System) Counters() *Counters { return s.cfg.counters }
