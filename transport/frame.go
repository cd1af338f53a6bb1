package transport

import "github.com/gobwas/ws"

// Server frames are unmasked (RFC 6455 §5.1), so one frame's bytes can be
// queued on every subscriber's Conn. A message is built after a reserved
// header gap (NewFrame) and Seal writes the header right before it: one
// allocation, no copy.

// FrameHeaderRoom is the gap NewFrame leaves for the longest text-frame header.
const FrameHeaderRoom = 10

// NewFrame returns a buffer to append one JSON message to, after the header gap.
func NewFrame(jsonCap int) []byte {
	return make([]byte, FrameHeaderRoom, FrameHeaderRoom+jsonCap)
}

// FramePayload is the message inside a buffer from NewFrame (or a sealed
// frame's buffer): what follows the header gap.
func FramePayload(buf []byte) []byte { return buf[FrameHeaderRoom:] }

// Seal writes a FIN text-frame header in front of buf[FrameHeaderRoom:] and
// returns the complete frame. buf must come from NewFrame; after Seal the
// bytes are read-only, shared by every Conn they are sent to.
func Seal(buf []byte) []byte {
	n := len(buf) - FrameHeaderRoom
	var start int
	switch {
	case n < 126:
		start = FrameHeaderRoom - 2
		buf[start+1] = byte(n)
	case n <= 0xFFFF:
		start = FrameHeaderRoom - 4
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

// TextFrame frames a finished JSON message (copying it once).
func TextFrame(json []byte) []byte {
	return Seal(append(NewFrame(len(json)), json...))
}

// CloseCode is a WebSocket close status (RFC 6455 §7.4); the application's
// own codes are in 4000–4999.
type CloseCode uint16

// Close codes the relay sends or reports.
const (
	CloseGoingAway     CloseCode = 1001 // shutdown, idle, lifetime: reconnect
	CloseNoStatus      CloseCode = 1005 // reported when a peer's close frame had no code; never sent
	CloseAbnormal      CloseCode = 1006 // reported when the connection ended without a close frame; never sent
	CloseInternalError CloseCode = 1011 // reported when the poller refused the socket; never sent
	CloseTryAgainLater CloseCode = 1013 // slow consumer: reconnect and resume by replay
)

func (c CloseCode) ws() ws.StatusCode { return ws.StatusCode(c) }
