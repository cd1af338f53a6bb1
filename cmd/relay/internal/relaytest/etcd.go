package relaytest

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
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

// StartEtcd starts etcd and returns once it answers /health. Its ports are
// chosen free a moment before etcd binds them; when another process took one
// meanwhile (etcd exits with "address already in use"), it tries new ones,
// three times in all.
func StartEtcd(t testing.TB) *Etcd {
	t.Helper()
	if _, err := exec.LookPath("etcd"); err != nil {
		t.Fatalf("etcd not found (apt-get install etcd-server): %v", err)
	}
	e := &Etcd{t: t}
	for attempt := 1; ; attempt++ {
		// A fresh data dir too: a member keeps the peer address it began with.
		e.dir, e.client, e.peer, e.Logs = t.TempDir(), FreeAddr(t), FreeAddr(t), &Buffer{}
		e.Endpoint = "http://" + e.client
		err := e.start()
		if err == nil {
			return e
		}
		if attempt == 3 || !strings.Contains(e.Logs.String(), "address already in use") {
			t.Fatalf("%v:\n%s", err, e.Logs)
		}
		t.Logf("etcd lost a port to another process, trying new ones: %v", err)
	}
}

// Start starts etcd again after Stop, on the same ports and data.
func (e *Etcd) Start() {
	e.t.Helper()
	if err := e.start(); err != nil {
		e.t.Fatalf("%v:\n%s", err, e.Logs)
	}
}

func (e *Etcd) start() error {
	e.cmd = exec.Command("etcd", "--name", "relaytest", "--data-dir", filepath.Join(e.dir, "data"),
		"--listen-client-urls", "http://"+e.client, "--advertise-client-urls", "http://"+e.client,
		"--listen-peer-urls", "http://"+e.peer, "--initial-advertise-peer-urls", "http://"+e.peer,
		"--initial-cluster", "relaytest=http://"+e.peer)
	e.cmd.Stdout, e.cmd.Stderr = e.Logs, e.Logs
	if err := e.cmd.Start(); err != nil {
		return fmt.Errorf("start etcd: %w", err)
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
				return nil
			}
		}
		select {
		case <-exited:
			return errors.New("etcd exited at start")
		default:
		}
		if time.Now().After(deadline) {
			e.Stop()
			return errors.New("etcd did not answer within 20 s")
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
