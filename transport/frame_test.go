package transport

import (
	"bytes"
	"testing"

	"github.com/gobwas/ws"
)

// Seal's header must be RFC 6455's for every length class: 7-bit (< 126),
// 16-bit (126 to 65 535) and 64-bit (a 128 KiB message needs it). gobwas/ws
// frames the same bytes independently.
func TestSealMatchesRFC6455(t *testing.T) {
	for _, n := range []int{0, 1, 125, 126, 127, 0xFFFF, 0x10000, 131072 + 100} {
		p := bytes.Repeat([]byte{'x'}, n)
		want := ws.MustCompileFrame(ws.NewTextFrame(p))
		buf := append(NewFrame(n), p...)
		if got := Seal(buf); !bytes.Equal(got, want) {
			t.Errorf("Seal, %d-byte payload: header % x, want % x", n, got[:min(len(got), 10)], want[:min(len(want), 10)])
		}
		if got := FramePayload(buf); !bytes.Equal(got, p) {
			t.Errorf("FramePayload after Seal, %d bytes: changed", n)
		}
		if got := TextFrame(p); !bytes.Equal(got, want) {
			t.Errorf("TextFrame, %d-byte payload: header % x, want % x", n, got[:min(len(got), 10)], want[:min(len(want), 10)])
		}
	}
}
