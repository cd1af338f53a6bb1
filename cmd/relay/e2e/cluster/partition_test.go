//go:build cluster

package cluster

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestClusterPartition: the chaos test's load and checker (clusterChaos),
// the fault a partition: the owner of the busy channels is cut off from
// etcd and the other nodes for longer than its lease while its clients
// still reach it; the others take its channels over, and it leaves once the
// network heals and it finds itself dropped. It checks what happens, not
// how fast, so it runs beside the other tests.
func TestClusterPartition(t *testing.T) {
	t.Parallel()
	clusterChaos(t, false, partitioned)
}

// A node to be cut off runs as partitionUID, in a group of its own
// (partitionGID: the files it must read are opened to that group alone),
// with its actor remote on a loopback address of its own (partitionAddr).
// The firewall then tells its traffic from the other nodes', all on
// loopback: what goes to or from that address, and the connections its
// user opens to etcd and the other nodes.
const (
	partitionUID = 65534 // nobody
	partitionGID = 64999 // no group: see relaytest.StartBinaryAs
)

// partitionAddr is a free cluster address on a loopback address of its own
// (127.100.0.0 to 127.199.255.255), for the node to cut off. The rules that
// name it cannot touch another process; those that name partitionUID's
// connections could cut the next such node, so the chains a killed test
// process left are removed here, before that node starts.
func partitionAddr(t *testing.T) string {
	t.Helper()
	sweepPartitions(t)
	for range 20 {
		addr := fmt.Sprintf("127.%d.%d.%d:%d", 100+rand.IntN(100), rand.IntN(256), 1+rand.IntN(254), 20000+rand.IntN(20000))
		if l, err := net.Listen("tcp", addr); err == nil {
			l.Close()
			return addr
		}
	}
	t.Fatal("no free loopback address for the node to cut off")
	return ""
}

// partition cuts the node whose actor remote is on ownAddr (a
// partitionAddr) and that runs as partitionUID off from etcd and the other
// members, both ways, as a network failure between them would: every
// packet to or from ownAddr's address, and every packet of the connections
// that user opens to the peers' and etcd's ports (marked as it sends), is
// dropped. Its HTTP and operator listeners stay reachable, as through a
// load balancer on the node's side of the failure. The rules sit in two
// chains of this run's own (partitionAddr removed those of test processes
// that are gone). heal removes the rules (once); so does the test's end.
func partition(t *testing.T, ownAddr string, peerAddrs []string, etcdEndpoint string) (heal func()) {
	t.Helper()
	split := func(addr string) (string, string) {
		host, port, err := net.SplitHostPort(strings.TrimPrefix(addr, "https://"))
		if err != nil {
			t.Fatalf("partition: address %q: %v", addr, err)
		}
		return host, port
	}
	own, _ := split(ownAddr)
	var ports []string
	for _, a := range append(peerAddrs, etcdEndpoint) {
		_, p := split(a)
		ports = append(ports, p)
	}
	tag := fmt.Sprintf("RTP%d-%04x", os.Getpid(), rand.IntN(1<<16))
	in, out := tag+"-I", tag+"-O"
	mark := fmt.Sprintf("0x%x", 0x5250_0000+rand.IntN(1<<16))
	uid := strconv.Itoa(partitionUID)
	steps := []struct{ do, undo []string }{
		{[]string{"-N", in}, []string{"-X", in}},
		{[]string{"-N", out}, []string{"-X", out}},
		{[]string{"-A", in, "-d", own, "-j", "DROP"}, []string{"-F", in}},
		{[]string{"-A", in, "-m", "connmark", "--mark", mark, "-j", "DROP"}, nil},
		{[]string{"-A", out, "-s", own, "-j", "DROP"}, []string{"-F", out}},
		{[]string{"-A", out, "-o", "lo", "-m", "owner", "--uid-owner", uid, "-p", "tcp", "-m", "multiport",
			"--dports", strings.Join(ports, ","), "-j", "CONNMARK", "--set-mark", mark}, nil},
		{[]string{"-A", out, "-m", "connmark", "--mark", mark, "-j", "DROP"}, nil},
		{[]string{"-I", "INPUT", "-j", in}, []string{"-D", "INPUT", "-j", in}},
		{[]string{"-I", "OUTPUT", "-j", out}, []string{"-D", "OUTPUT", "-j", out}},
	}
	var undo [][]string // what succeeded, undone in reverse
	healed := false
	heal = func() {
		if healed {
			return
		}
		healed = true
		for i := len(undo) - 1; i >= 0; i-- {
			if err := iptables(undo[i]...); err != nil {
				t.Errorf("healing the partition: %v", err)
			}
		}
	}
	t.Cleanup(heal)
	for _, s := range steps {
		if err := iptables(s.do...); err != nil {
			heal()
			t.Fatalf("partition (the cluster tests run as root, with Debian's iptables): %v", err)
		}
		if s.undo != nil {
			undo = append(undo, s.undo)
		}
	}
	return heal
}

// iptables runs iptables, waiting up to 10 s for its lock.
func iptables(args ...string) error {
	if b, err := exec.Command("iptables", append([]string{"-w", "10"}, args...)...).CombinedOutput(); err != nil {
		return fmt.Errorf("iptables %s: %v: %s", strings.Join(args, " "), err, b)
	}
	return nil
}

// sweepPartitions removes the chains (and their jumps) of test processes
// that are gone.
func sweepPartitions(t *testing.T) {
	t.Helper()
	b, err := exec.Command("iptables", "-w", "10", "-S").Output()
	if err != nil {
		t.Fatalf("partition: iptables -S: %v", err)
	}
	chain := regexp.MustCompile(`^-N (RTP(\d+)-[0-9a-f]{4}-[IO])$`)
	for _, line := range strings.Split(string(b), "\n") {
		m := chain.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if pid, _ := strconv.Atoi(m[2]); pid == os.Getpid() || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		for _, parent := range []string{"INPUT", "OUTPUT"} {
			for iptables("-D", parent, "-j", m[1]) == nil {
			}
		}
		if err := iptables("-F", m[1]); err == nil {
			iptables("-X", m[1])
		}
		t.Logf("partition: removed %s, left by a test process that is gone", m[1])
	}
}
