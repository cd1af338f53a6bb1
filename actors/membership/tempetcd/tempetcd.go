// Package tempetcd runs a throwaway single-member etcd (Debian's
// etcd-server) for the membership tests and the load tool
// (cmd/relay-bench): plain TCP on loopback, its data in a temporary
// directory named PREFIX-PID-… (PID is the caller's). The process is killed
// with its caller (a parent-death signal), so a caller that crashes leaves
// no etcd behind; the next Start with the same prefix removes the
// directories of callers that are gone.
package tempetcd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Etcd is a running throwaway etcd.
type Etcd struct {
	Endpoint string // http://127.0.0.1:PORT
	Dir      string // data and etcd.log

	name, client, peer string
	cmd                *exec.Cmd
	done               chan struct{}
}

// Start starts etcd in a new directory named prefix-PID-… on free loopback
// ports and returns once it answers /health (within 20 s).
func Start(ctx context.Context, prefix string) (*Etcd, error) {
	if _, err := exec.LookPath("etcd"); err != nil {
		return nil, fmt.Errorf("etcd not found (apt-get install etcd-server): %w", err)
	}
	sweep(prefix)
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s-%d-", prefix, os.Getpid()))
	if err != nil {
		return nil, err
	}
	e := &Etcd{Dir: dir, name: prefix}
	if e.client, err = freeAddr(); err == nil {
		e.peer, err = freeAddr()
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	e.Endpoint = "http://" + e.client
	if err := e.Restart(ctx); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return e, nil
}

// Restart starts etcd again on the same ports and data, after Kill (an
// outage and a recovery, as an operator's restart makes them).
func (e *Etcd) Restart(ctx context.Context) error {
	logf, err := os.OpenFile(filepath.Join(e.Dir, "etcd.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own descriptor
	e.cmd = exec.Command("etcd", "--name", e.name, "--data-dir", filepath.Join(e.Dir, "data"),
		"--listen-client-urls", "http://"+e.client, "--advertise-client-urls", "http://"+e.client,
		"--listen-peer-urls", "http://"+e.peer, "--initial-advertise-peer-urls", "http://"+e.peer,
		"--initial-cluster", e.name+"=http://"+e.peer)
	e.cmd.Stdout, e.cmd.Stderr = logf, logf
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with its caller
	if err := e.cmd.Start(); err != nil {
		return fmt.Errorf("starting etcd: %w", err)
	}
	e.done = make(chan struct{})
	cmd, done := e.cmd, e.done
	go func() { cmd.Wait(); close(done) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := http.Get(e.Endpoint + "/health")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
		}
		var why string
		select {
		case <-done:
			why = "etcd exited at start"
		case <-ctx.Done():
			why = ctx.Err().Error()
		default:
			if time.Now().After(deadline) {
				why = "etcd did not answer within 20 s"
			}
		}
		if why != "" {
			e.Kill()
			return fmt.Errorf("%s:\n%s", why, e.LogTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// PID is etcd's process id.
func (e *Etcd) PID() int { return e.cmd.Process.Pid }

// LogTail is the last 4 KiB etcd logged.
func (e *Etcd) LogTail() string {
	b, _ := os.ReadFile(filepath.Join(e.Dir, "etcd.log"))
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return string(b)
}

// Kill kills etcd (SIGKILL, by its pid) and waits until it has exited;
// its data stays for Restart. Killing a stopped etcd does nothing.
func (e *Etcd) Kill() {
	select {
	case <-e.done:
	default:
		e.cmd.Process.Kill()
		<-e.done
	}
}

// Stop kills etcd and removes its directory.
func (e *Etcd) Stop() {
	e.Kill()
	os.RemoveAll(e.Dir)
}

// sweep removes the directories prefix-PID-… of processes that are gone.
// Their etcd died with them (the parent-death signal).
func sweep(prefix string) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"-*"))
	for _, dir := range dirs {
		pidText, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(dir), prefix+"-"), "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			os.RemoveAll(dir)
		}
	}
}

// freeAddr is 127.0.0.1:PORT with a port that was free a moment ago.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}
