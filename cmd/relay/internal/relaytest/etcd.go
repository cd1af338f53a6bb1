package relaytest

import (
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// Etcd is a throwaway single-member etcd (Debian's etcd-server) on loopback,
// its data in the test's temp dir. It is killed, by its pid, when the test ends.
type Etcd struct {
	Endpoint string // http://127.0.0.1:PORT, for RELAY_CLUSTER_ETCD
	Logs     *Buffer

	t          testing.TB
	dir        string
	client     string // 127.0.0.1:PORT
	peer       string
	cmd        *exec.Cmd
	exited     chan struct{}
	cleanupSet bool
}

// StartEtcd starts etcd and returns once it answers /health.
func StartEtcd(t testing.TB) *Etcd {
	t.Helper()
	if _, err := exec.LookPath("etcd"); err != nil {
		t.Fatalf("etcd not found (apt-get install etcd-server): %v", err)
	}
	e := &Etcd{t: t, dir: t.TempDir(), client: FreeAddr(t), peer: FreeAddr(t), Logs: &Buffer{}}
	e.Endpoint = "http://" + e.client
	e.Start()
	return e
}

// Start starts etcd again after Stop, on the same ports and data.
func (e *Etcd) Start() {
	e.t.Helper()
	e.cmd = exec.Command("etcd", "--name", "relaytest", "--data-dir", filepath.Join(e.dir, "data"),
		"--listen-client-urls", "http://"+e.client, "--advertise-client-urls", "http://"+e.client,
		"--listen-peer-urls", "http://"+e.peer, "--initial-advertise-peer-urls", "http://"+e.peer,
		"--initial-cluster", "relaytest=http://"+e.peer)
	e.cmd.Stdout, e.cmd.Stderr = e.Logs, e.Logs
	if err := e.cmd.Start(); err != nil {
		e.t.Fatalf("start etcd: %v", err)
	}
	e.exited = make(chan struct{})
	cmd, exited := e.cmd, e.exited
	go func() { cmd.Wait(); close(exited) }()
	if !e.cleanupSet {
		e.cleanupSet = true
		e.t.Cleanup(e.Stop)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := http.Get(e.Endpoint + "/health")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-exited:
			e.t.Fatalf("etcd exited at start:\n%s", e.Logs)
		default:
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("etcd did not answer within 20 s:\n%s", e.Logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop kills etcd (SIGKILL, by its pid: an outage, not a clean stop) and
// waits until it has exited. Stopping a stopped etcd does nothing.
func (e *Etcd) Stop() {
	select {
	case <-e.exited:
		return
	default:
	}
	syscall.Kill(e.cmd.Process.Pid, syscall.SIGKILL)
	<-e.exited
}

// FreeAddr returns 127.0.0.1:PORT with a port that was free a moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return fmt.Sprint(ln.Addr())
}
