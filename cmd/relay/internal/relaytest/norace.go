//go:build !race

package relaytest

const raceEnabled = false
