package actors

import "slices"

// roster counts a channel's presence subscriptions by clientId: a clientId
// is a member from its first subscription to its last (join and leave), and
// the members are kept sorted for sync. The channel actor and, in a
// cluster, the channel grain each own one.
type roster struct {
	counts map[string]int // clientId → presence subscriptions
	sorted []string       // the members
}

func newRoster() roster { return roster{counts: map[string]int{}} }

// add counts one subscription; true when it is clientID's first (a join).
func (r *roster) add(clientID string) bool {
	if r.counts[clientID]++; r.counts[clientID] > 1 {
		return false
	}
	i, _ := slices.BinarySearch(r.sorted, clientID)
	r.sorted = slices.Insert(r.sorted, i, clientID)
	return true
}

// remove uncounts one; true when it was clientID's last (a leave).
func (r *roster) remove(clientID string) bool {
	if r.counts[clientID]--; r.counts[clientID] > 0 {
		return false
	}
	delete(r.counts, clientID)
	if i, ok := slices.BinarySearch(r.sorted, clientID); ok {
		r.sorted = slices.Delete(r.sorted, i, i+1)
	}
	return true
}

// full: clientID would be a new member and there are max already (0: no
// cap); leaving says the subscriber's previous clientId, its only
// subscription, leaves with this change.
func (r *roster) full(clientID string, leaving bool, max int) bool {
	if max <= 0 || r.counts[clientID] > 0 {
		return false
	}
	n := len(r.counts)
	if leaving {
		n--
	}
	return n >= max
}

// only: clientID has exactly one presence subscription.
// len is the number of distinct clientIds.
func (r *roster) len() int { return len(r.counts) }

func (r *roster) only(clientID string) bool { return r.counts[clientID] == 1 }

// others lists the members a subscriber under clientID is told in its
// sync: all of them but itself, unless another subscription also counts it
// (self: this subscriber is already counted). The result may share the
// roster's array: encode it before the roster changes.
func (r *roster) others(clientID string, self bool) []string {
	if !self || r.counts[clientID] > 1 {
		return r.sorted
	}
	i, _ := slices.BinarySearch(r.sorted, clientID)
	return append(r.sorted[:i:i], r.sorted[i+1:]...)
}

// list is a copy of the members, never nil.
func (r *roster) list() []string {
	if len(r.sorted) == 0 {
		return []string{}
	}
	return slices.Clone(r.sorted)
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
