// Package relaytest is the black-box harness of cmd/relay's tests: the real
// binary started once built (StartBinary), one HTTP request helper (Do), a
// polling wait with a deadline (Eventually), a parsed /metrics scrape
// (ScrapeMetrics) and a test clock (Clock) for the in-process server. It
// knows the service only by its addresses, its log lines and its wire.
package relaytest
