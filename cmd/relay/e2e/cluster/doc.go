// Package cluster holds the tests of several relay nodes as one relay
// (`make test-cluster`: go test -tags cluster). Each test starts its own
// etcd (Debian's etcd-server), a throwaway PostgreSQL, HAProxy where it
// needs one, and real relay processes, all on loopback, and ends only the
// processes it started, by their pids. They reach the relay as its users
// and operators do, through its listeners and its commands, with the
// shared harness cmd/relay/internal/relaytest; the attack tests also speak
// the cluster port's own protocol, as an attacker who reached it would.
// The partition test runs one node as another user, on a loopback address
// of its own, and drops its packets with iptables (as root), in chains
// named after the test process: removed at its end, or by the next run
// when a killed test process left them.
//
// Tests that check what the cluster does run in parallel (t.Parallel, after
// the others). Those that time it (failover, a restart's stall, a SIGSTOPped
// node, HAProxy's health checks, a change applied within seconds) or stop
// the shared PostgreSQL run alone.
package cluster
