// Package actors is the relay's actor system on protoactor-go: project, channel
// and connection actors, their messages, budgets, presence and replay. It never
// touches SQL or HTTP; loads go through the small interfaces of loaders.go, and
// sockets through the Sink handle the transport provides.
//
// A channel's rules are written once, in channel_core.go (plain Go, tested by
// one table); channel.go hosts the core on one node, cluster_channel_grain.go
// in a cluster, and channel_fanout.go is the one place that writes a
// channel's frames to sockets, on one node and on every node of a cluster.
// What only a cluster needs (membership, grains, handoffs, the wire) is in the
// files named cluster_*.go: a prefix, not a subpackage, because the cluster
// shares the project and channel actors' unexported messages and state, and
// a subpackage would have to export them.
package actors
