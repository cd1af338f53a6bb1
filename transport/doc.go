// Package transport serves WebSocket connections (gobwas/ws framing) over an
// epoll poller: an idle connection costs no goroutine and no buffer beyond its
// small Conn struct. A fixed pool of workers reads whole frames without
// blocking (partial frames wait in the connection until the rest arrives) and
// flushes per-connection write queues with writev. Idle and lifetime limits
// are enforced by one sweeper, not a timer per connection.
//
// The package knows sockets and frames only: what a message means is the
// Handler's business.
package transport
