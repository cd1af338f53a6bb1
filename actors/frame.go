package actors

// Server frames are unmasked (RFC 6455 §5.1), so one frame's bytes can go to
// every subscriber. frameBuf builds the JSON after a reserved header gap and
// then writes the header right before it: one allocation, no copy.

const maxFrameHeader = 10

// newFrameBuf returns a buffer whose JSON part starts after the header gap.
func newFrameBuf(jsonCap int) []byte {
	return make([]byte, maxFrameHeader, maxFrameHeader+jsonCap)
}

// sealFrame writes a FIN text-frame header in front of buf[maxFrameHeader:]
// and returns the complete frame.
func sealFrame(buf []byte) []byte {
	n := len(buf) - maxFrameHeader
	var start int
	switch {
	case n < 126:
		start = maxFrameHeader - 2
		buf[start+1] = byte(n)
	case n <= 0xFFFF:
		start = maxFrameHeader - 4
		buf[start+1] = 126
		buf[start+2], buf[start+3] = byte(n>>8), byte(n)
	default:
		start = 0
		buf[1] = 127
		for i := 0; i < 8; i++ {
			buf[2+i] = byte(uint64(n) >> (56 - 8*i))
		}
	}
	buf[start] = 0x81 // FIN + text
	return buf[start:]
}

// textFrame wraps a finished JSON value (copying it once).
func textFrame(json []byte) []byte {
	return sealFrame(append(newFrameBuf(len(json)), json...))
}
