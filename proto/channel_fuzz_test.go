package proto

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

// channelPattern is the channel-name rule of PROTOCOL.md › subscribe, verbatim.
var channelPattern = regexp.MustCompile(`^[a-zA-Z0-9_\-.:]+$`)

// specChannel is the spec's rule read literally: 1 to 200 characters
// matching the pattern.
func specChannel(s string) bool {
	n := len([]rune(s))
	return n >= 1 && n <= 200 && channelPattern.MatchString(s)
}

// FuzzValidChannel: ValidChannel agrees with the spec's regexp and length
// rule on every string, and a valid name never needs JSON escaping (the
// Append* encoders copy channel names into frames as they are).
func FuzzValidChannel(f *testing.F) {
	for _, s := range []string{
		"", "a", "room-1", "a.b:c_d-e", "private-x", "sp ace", "new\nline", "a/b", "é", "ab\x00",
		"chan\"quote", "a\\b", "<script>", strings.Repeat("x", 200), strings.Repeat("x", 201),
		strings.Repeat("é", 100), "\xff", "room$", "ROOM.09:__--..",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, want := ValidChannel(s), specChannel(s)
		if got != want {
			t.Fatalf("ValidChannel(%q) = %v, spec says %v", s, got, want)
		}
		if !got {
			return
		}
		b, err := json.Marshal(s)
		if err != nil || string(b) != `"`+s+`"` {
			t.Fatalf("valid channel %q marshals as %s (%v): would need escaping", s, b, err)
		}
	})
}
