//go:build cluster

package cluster

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// partitionUID is the user a node to be cut off runs as (nodeAs): the
// firewall tells its packets from the other nodes' by their owner, since
// every node is on loopback.
const partitionUID = 65534 // nobody

// partition cuts the node that runs as partitionUID, with its actor remote
// on ownAddr, off from etcd and from the other members, as a network
// failure between it and them would: the packets it sends to etcd's and
// the peers' ports, and every packet to or from its own cluster port, are
// dropped (iptables, on loopback, in two chains named after this test
// process). Its HTTP and operator listeners stay reachable, as through a
// load balancer on the node's side of the failure. heal removes the rules,
// once; the test's end heals too.
func partition(t *testing.T, ownAddr string, peerAddrs []string, etcdEndpoint string) (heal func()) {
	t.Helper()
	port := func(addr string) string {
		_, p, err := net.SplitHostPort(strings.TrimPrefix(strings.TrimPrefix(addr, "https://"), "http://"))
		if err != nil {
			t.Fatalf("partition: address %q: %v", addr, err)
		}
		return p
	}
	var out []string
	for _, a := range append(peerAddrs, etcdEndpoint) {
		out = append(out, port(a))
	}
	own := port(ownAddr)
	in, outChain := fmt.Sprintf("RT%d-IN", os.Getpid()), fmt.Sprintf("RT%d-OUT", os.Getpid())
	iptables := func(args ...string) error {
		if b, err := exec.Command("iptables", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("iptables %s: %v: %s", strings.Join(args, " "), err, b)
		}
		return nil
	}
	heal = sync.OnceFunc(func() {
		for _, args := range [][]string{{"-D", "INPUT", "-j", in}, {"-D", "OUTPUT", "-j", outChain},
			{"-F", in}, {"-X", in}, {"-F", outChain}, {"-X", outChain}} {
			if err := iptables(args...); err != nil {
				t.Errorf("healing the partition: %v", err)
			}
		}
	})
	uid := fmt.Sprint(partitionUID)
	for _, args := range [][]string{
		{"-N", in}, {"-N", outChain},
		{"-A", in, "-i", "lo", "-p", "tcp", "--dport", own, "-j", "DROP"},
		{"-A", outChain, "-o", "lo", "-p", "tcp", "--sport", own, "-j", "DROP"},
		{"-A", outChain, "-o", "lo", "-m", "owner", "--uid-owner", uid, "-p", "tcp", "-m", "multiport", "--dports", strings.Join(out, ","), "-j", "DROP"},
		{"-I", "INPUT", "-j", in}, {"-I", "OUTPUT", "-j", outChain},
	} {
		if err := iptables(args...); err != nil {
			heal()
			t.Fatalf("partition (the cluster tests run as root, with Debian's iptables): %v", err)
		}
	}
	t.Cleanup(heal)
	return heal
}
