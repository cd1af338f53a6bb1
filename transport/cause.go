package transport

// Cause names why a connection ended. Each has a close code, a counter in
// Stats and a debug log line; cmd/relay/OPERATING.md › Close codes lists them for clients.
type Cause uint8

const (
	CausePeerClosed   Cause = iota // the client sent a close frame (its code is echoed)
	CausePeerGone                  // TCP dropped without a close handshake, or a write failed
	CauseIdle                      // no data either way for IdleTimeout: 1001
	CauseLifetime                  // older than MaxLifetime: 1001
	CauseSlowConsumer              // write queue overflowed or a write timed out: 1013
	CauseTooBig                    // frame or message over MaxMessageBytes: 1009
	CauseProtocol                  // malformed frame: 1002, or invalid UTF-8: 1007
	CauseApplication               // closed by the Handler's side (e.g. project deleted: 4004)
	CauseShutdown                  // server shutting down: 1001
	numCauses
)

var causeNames = [numCauses]string{
	"peer_closed", "peer_gone", "idle", "lifetime", "slow_consumer", "too_big", "protocol", "application", "shutdown",
}

func (c Cause) String() string {
	if c < numCauses {
		return causeNames[c]
	}
	return "unknown"
}

// Causes lists every cause, for metrics and documentation.
func Causes() []Cause {
	out := make([]Cause, numCauses)
	for i := range out {
		out[i] = Cause(i)
	}
	return out
}
