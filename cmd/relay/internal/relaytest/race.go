//go:build race

package relaytest

// raceEnabled: this test binary runs under the race detector, and so do the
// relays Start starts.
const raceEnabled = true
