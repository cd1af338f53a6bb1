package actors

import "slices"

// roster counts a channel's presence subscriptions by clientId: a clientId
// is a member from its first subscription to its last (join and leave), and
// the members are kept sorted for sync. The channel core owns one.
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
