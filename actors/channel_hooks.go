package actors

import "github.com/asynkron/protoactor-go/actor"

// The channel and presence webhooks a project opts in to (README.md ›
// Webhooks and usage): decided where a channel's subscribers and presence
// roster are known whole, the channel actor on one node and the channel
// grain in a cluster, so that each transition is sent once.
const (
	HookChannelOccupied = "channel_occupied" // the channel's first subscriber
	HookChannelVacated  = "channel_vacated"  // its last subscriber left
	HookMemberAdded     = "member_added"     // a clientId joined its presence roster
	HookMemberRemoved   = "member_removed"   // a clientId left it
)

// hookTarget is where a project's channel and presence events go, and
// which of them; nil when it wants none (no URL, or neither opted in).
type hookTarget struct {
	url, secret       string
	channel, presence bool
}

func hookTargetOf(s Settings) *hookTarget {
	if s.WebhookURL == "" || (!s.WebhookChannelEvents && !s.WebhookPresenceEvents) {
		return nil
	}
	return &hookTarget{url: s.WebhookURL, secret: s.WebhookSecret, channel: s.WebhookChannelEvents, presence: s.WebhookPresenceEvents}
}

func sameTarget(a, b *hookTarget) bool {
	return a == b || (a != nil && b != nil && *a == *b)
}

// hooksChanged tells a channel actor or a channel grain its project's
// target: sent by the project actor when its settings are first loaded and
// whenever the target changes (to a channel grain when it asks, watchHooks).
//
// channelLimit goes with it to the grains, the project's channel emits per
// minute as this node loaded it (0: not known), so that a grain applies its
// own settings, not a number a peer put in a publish.
type hooksChanged struct {
	target       *hookTarget
	channelLimit int
	history      bool // the project keeps channel history (grains store before they answer)
}

// watchHooks: a channel grain asks its node's project actor for the
// project's target, now (once the settings are loaded) and at every change,
// until unwatchHooks. The project actor stays while it has watchers.
type watchHooks struct{ grain *actor.PID }

type unwatchHooks struct{ grain *actor.PID }

func (*watchHooks) fromEdge()   {}
func (*unwatchHooks) fromEdge() {}

// channelHooks is a channel's (actor or grain) view of its project's
// target. Until the project actor has told it (its settings are loading),
// events wait, at most maxHeldHooks, with the time they happened.
type channelHooks struct {
	known   bool
	target  *hookTarget
	held    []WebhookEvent
	dropped int
}

// maxHeldHooks bounds the events one channel holds while its project's
// settings load; more are dropped (logged when the settings come).
const maxHeldHooks = 64

// wantsPresence: member events are sent or may be (settings unknown yet).
func (h *channelHooks) wantsPresence() bool {
	return !h.known || (h.target != nil && h.target.presence)
}

// occupancy reports channel_occupied (occupied) or channel_vacated.
func (h *channelHooks) occupancy(cfg *Config, project, channel string, occupied bool) {
	if h.known && (h.target == nil || !h.target.channel) {
		return // not opted in: nothing built, nothing sent
	}
	kind := HookChannelVacated
	if occupied {
		kind = HookChannelOccupied
	}
	h.event(cfg, WebhookEvent{Kind: kind, ProjectID: project, Channel: channel, At: cfg.Now()})
}

// member reports member_added (added) or member_removed for clientID.
func (h *channelHooks) member(cfg *Config, project, channel, clientID string, added bool) {
	if !h.wantsPresence() {
		return
	}
	kind := HookMemberRemoved
	if added {
		kind = HookMemberAdded
	}
	h.event(cfg, WebhookEvent{Kind: kind, ProjectID: project, Channel: channel, ClientID: clientID, At: cfg.Now()})
}

func (h *channelHooks) event(cfg *Config, ev WebhookEvent) {
	if !h.known {
		if len(h.held) < maxHeldHooks {
			h.held = append(h.held, ev)
		} else {
			h.dropped++
		}
		return
	}
	h.send(cfg, ev)
}

// send hands ev to the webhook queue (never blocks) if the target wants it.
func (h *channelHooks) send(cfg *Config, ev WebhookEvent) {
	t := h.target
	if t == nil {
		return
	}
	switch ev.Kind {
	case HookChannelOccupied, HookChannelVacated:
		if !t.channel {
			return
		}
	default:
		if !t.presence {
			return
		}
	}
	cfg.Webhooks(t.url, t.secret, ev)
}

// set takes the project's target and sends what waited for it.
func (h *channelHooks) set(cfg *Config, t *hookTarget) {
	h.known, h.target = true, t
	if h.dropped > 0 && t != nil {
		cfg.Logger.Warn("channel webhooks dropped while the project's settings loaded", "dropped", h.dropped)
	}
	for _, ev := range h.held {
		h.send(cfg, ev)
	}
	h.held, h.dropped = nil, 0
}

// knownHooks is the view a channel actor starts with: the target when its
// project actor has loaded its settings, else unknown (it is told later).
func knownHooks(ready bool, t *hookTarget) channelHooks {
	return channelHooks{known: ready, target: t}
}
