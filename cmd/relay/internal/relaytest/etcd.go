package relaytest

import (
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/relayhq/relay/actors/clustertls"
)

// Etcd is a throwaway single-member etcd (Debian's etcd-server) on loopback,
// its data in the test's temp dir. It is killed, by its pid, when the test
// ends, and with the test process if that dies first.
// Its clients speak TLS and must show a certificate of etcd's own CA
// (--client-cert-auth), as in production; Env has what a node needs.
type Etcd struct {
	Endpoint string // https://127.0.0.1:PORT, for RELAY_CLUSTER_ETCD
	// PEM files for RELAY_CLUSTER_ETCD_CA, _CERT and _KEY: etcd's CA and a
	// client certificate it signed.
	CA, Cert, Key string
	Logs          *Buffer

	t          testing.TB
	dir        string
	serverCert string // etcd's own certificate and key
	serverKey  string
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
	if err := e.makeCerts(t.TempDir()); err != nil {
		t.Fatalf("etcd certificates: %v", err)
	}
	health, err := e.healthClient()
	if err != nil {
		t.Fatal(err)
	}
	for attempt := 1; ; attempt++ {
		// A fresh data dir too: a member keeps the peer address it began with.
		e.dir, e.client, e.peer, e.Logs = t.TempDir(), FreeAddr(t), FreeAddr(t), &Buffer{}
		e.Endpoint = "https://" + e.client
		err := e.start(health)
		if err == nil {
			return e
		}
		if attempt == 3 || !strings.Contains(e.Logs.String(), "address already in use") {
			t.Fatalf("%v:\n%s", err, e.Logs)
		}
		t.Logf("etcd lost a port to another process, trying new ones: %v", err)
	}
}

// Env is what a relay node needs to reach this etcd.
func (e *Etcd) Env() []string {
	return []string{"RELAY_CLUSTER_ETCD=" + e.Endpoint, "RELAY_CLUSTER_ETCD_CA=" + e.CA,
		"RELAY_CLUSTER_ETCD_CERT=" + e.Cert, "RELAY_CLUSTER_ETCD_KEY=" + e.Key}
}

// makeCerts writes etcd's CA, its server certificate for 127.0.0.1 and a
// client certificate into dir.
func (e *Etcd) makeCerts(dir string) error {
	now := time.Now()
	ca, err := clustertls.NewCA("relaytest etcd CA", now)
	if err != nil {
		return err
	}
	server, err := clustertls.NewNode(ca, []string{"127.0.0.1"}, now)
	if err != nil {
		return err
	}
	client, err := clustertls.NewNode(ca, []string{"relay"}, now)
	if err != nil {
		return err
	}
	e.CA, e.Cert, e.Key = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	e.serverCert, e.serverKey = filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	for path, b := range map[string][]byte{e.CA: ca.CertPEM, e.Cert: client.CertPEM, e.Key: client.KeyPEM,
		e.serverCert: server.CertPEM, e.serverKey: server.KeyPEM} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// Start starts etcd again after Stop, on the same ports and data.
func (e *Etcd) Start() {
	e.t.Helper()
	health, err := e.healthClient()
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.start(health); err != nil {
		e.t.Fatalf("%v:\n%s", err, e.Logs)
	}
}

// healthClient is makeCerts's client again, from the files.
func (e *Etcd) healthClient() (*http.Client, error) {
	pair, err := tls.LoadX509KeyPair(e.Cert, e.Key)
	if err != nil {
		return nil, err
	}
	roots, err := clustertls.LoadCA(e.CA)
	if err != nil {
		return nil, err
	}
	return &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}}}}, nil
}

func (e *Etcd) start(health *http.Client) error {
	e.cmd = exec.Command("etcd", "--name", "relaytest", "--data-dir", filepath.Join(e.dir, "data"),
		"--listen-client-urls", "https://"+e.client, "--advertise-client-urls", "https://"+e.client,
		"--cert-file", e.serverCert, "--key-file", e.serverKey, "--trusted-ca-file", e.CA, "--client-cert-auth",
		"--listen-peer-urls", "http://"+e.peer, "--initial-advertise-peer-urls", "http://"+e.peer,
		"--initial-cluster", "relaytest=http://"+e.peer)
	e.cmd.Stdout, e.cmd.Stderr = e.Logs, e.Logs
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // a test binary that crashes leaves no etcd behind
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
		res, err := health.Get(e.Endpoint + "/health")
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
// The port is below the kernel's ephemeral range (ip_local_port_range), so
// that no connection or port-0 listener of another test, which the kernel
// gives ephemeral ports, takes it before the caller binds it; and it is
// never one this process was given before, so two calls made before either
// port is bound do not collide.
func FreeAddr(t testing.TB) string {
	t.Helper()
	const lowest = 10000
	if top := ephemeralLow(); top-lowest >= 1000 {
		for range 100 {
			port := lowest + rand.IntN(top-lowest)
			if _, taken := givenPorts.LoadOrStore(port, true); taken {
				continue
			}
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err == nil {
				ln.Close()
				return ln.Addr().String()
			}
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return fmt.Sprint(ln.Addr())
}

// givenPorts are the ports FreeAddr chose in this process.
var givenPorts sync.Map

// ephemeralLow is the first port of the kernel's ephemeral range (0 when
// unknown).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	var low int
	fmt.Sscan(string(b), &low)
	return low
}
