// Package relaytest is the black-box harness of cmd/relay's tests: the real
// binary started once built (StartBinary), one HTTP request helper (Do), a
// polling wait with a deadline (Eventually), a parsed /metrics scrape
// (ScrapeMetrics), a test clock (Clock) for the in-process server, and for
// the cluster tests a throwaway etcd (StartEtcd), a free loopback address
// (FreeAddr) and a start expected to fail (RunBinary). It
// knows the service only by its addresses, its log lines and its wire.
package relaytest
