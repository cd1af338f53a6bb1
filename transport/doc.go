// Package transport serves WebSocket connections (gobwas/ws framing) over an
// epoll poller: an idle connection costs no goroutine and no buffer beyond its
// small Conn struct. A fixed pool of workers reads whole frames without
// blocking (partial frames wait in the connection until the rest arrives) and
// flushes per-connection write queues with writev. Idle and lifetime limits
// are enforced by one sweeper, not a timer per connection.
//
// An upgraded socket leaves net/http and Go's poller: the Conn keeps a
// duplicate of its descriptor in the epoll set and closes the net.Conn,
// whose poller entry (512 bytes outside the heap), state and addresses were
// more than half of an idle connection's memory. A write that finds a slow
// peer's socket buffer full waits without a goroutine either: the socket is
// armed in a second epoll set for writability, and a timer per stalled batch
// drops the peer after WriteTimeout.
//
// The package knows sockets and frames only: what a message means is the
// Handler's business.
package transport
