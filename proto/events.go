package proto

import (
	"strconv"
)

// AppendClientMessage appends a client-emitted message:
// {"channel":…,"type":…,"payload":…,"seq":…,"clientId":…}.
func AppendClientMessage(dst []byte, channel, typ string, payload []byte, seq uint64, clientID string) []byte {
	dst = append(dst, `{"channel":"`...)
	dst = append(dst, channel...)
	dst = append(dst, `","type":`...)
	dst = AppendString(dst, typ)
	dst = append(dst, `,"payload":`...)
	dst = append(dst, payload...)
	dst = append(dst, `,"seq":`...)
	dst = strconv.AppendUint(dst, seq, 10)
	dst = append(dst, `,"clientId":`...)
	dst = AppendString(dst, clientID)
	return append(dst, '}')
}

// AppendReplayed turns a message object (as built by AppendMessage or
// AppendClientMessage) into its replayed form, with "replay":true.
func AppendReplayed(dst, message []byte) []byte {
	dst = append(dst, message[:len(message)-1]...)
	return append(dst, `,"replay":true}`...)
}

// AppendEmitAck appends {"action":"emit","channel":…,"ok":true,"seq":…}.
func AppendEmitAck(dst []byte, channel string, seq uint64) []byte {
	dst = append(dst, `{"action":"emit","channel":"`...)
	dst = append(dst, channel...)
	dst = append(dst, `","ok":true,"seq":`...)
	dst = strconv.AppendUint(dst, seq, 10)
	return append(dst, '}')
}

// Presence events of PROTOCOL.md › Presence.
const (
	PresenceSync  = "sync"
	PresenceJoin  = "join"
	PresenceLeave = "leave"
)

// AppendPresenceSync appends {"type":"presence","channel":…,"event":"sync","members":[…]}.
func AppendPresenceSync(dst []byte, channel string, members []string) []byte {
	dst = append(dst, `{"type":"presence","channel":"`...)
	dst = append(dst, channel...)
	dst = append(dst, `","event":"sync","members":[`...)
	for i, m := range members {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = AppendString(dst, m)
	}
	return append(dst, "]}"...)
}

// AppendPresenceEvent appends {"type":"presence","channel":…,"event":join|leave,"clientId":…}.
func AppendPresenceEvent(dst []byte, channel, event, clientID string) []byte {
	dst = append(dst, `{"type":"presence","channel":"`...)
	dst = append(dst, channel...)
	dst = append(dst, `","event":"`...)
	dst = append(dst, event...)
	dst = append(dst, `","clientId":`...)
	dst = AppendString(dst, clientID)
	return append(dst, '}')
}

// AppendReplayGap appends {"type":"replay_gap","channel":…,"since":…}.
func AppendReplayGap(dst []byte, channel string, since float64) []byte {
	dst = append(dst, `{"type":"replay_gap","channel":"`...)
	dst = append(dst, channel...)
	dst = append(dst, `","since":`...)
	dst = strconv.AppendFloat(dst, since, 'f', -1, 64)
	return append(dst, '}')
}
