package proto

// Limits of PROTOCOL.md › Limits that every side shares.
const (
	// MaxMessageBytes caps the serialized {channel,payload} of an emit.
	MaxMessageBytes = 131072
	// MaxChannelLen is the longest channel name.
	MaxChannelLen = 200
	// MinPasswordLen is the shortest password signup accepts.
	MinPasswordLen = 8
)

// MessageSize is the length of the serialized {"channel":…,"payload":…} object
// whose cap is MaxMessageBytes. payload is the raw JSON value as received, so
// the figure does not depend on how a client formatted the rest of its request.
func MessageSize(channel string, payload []byte) int {
	// {"channel":"<channel>","payload":<payload>}; channel names never need escaping.
	return len(`{"channel":"","payload":}`) + len(channel) + len(payload)
}
