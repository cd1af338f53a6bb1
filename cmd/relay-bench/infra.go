package main

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/uptrace/bun/driver/pgdriver"

	"github.com/relayhq/relay/store/tempdb"
)

// What `relay-bench cluster` runs besides the relay: a throwaway etcd and a
// throwaway PostgreSQL, on loopback and a unix socket, in temporary
// directories named relay-bench-etcd-PID-… and relay-bench-pg-PID-… (PID is
// this process's). The tool stops both itself; a PostgreSQL left behind by a
// relay-bench that was killed (pg_ctl detaches it) is stopped by the next run,
// found by its directory's name.

// etcdProcess is a single-member etcd (Debian's etcd-server), as the cluster
// tests start it (cmd/relay/internal/relaytest).
type etcdProcess struct {
	cmd      *exec.Cmd
	dir      string
	endpoint string // http://127.0.0.1:PORT
	done     chan struct{}
}

func startEtcd(ctx context.Context) (*etcdProcess, error) {
	if _, err := exec.LookPath("etcd"); err != nil {
		return nil, fmt.Errorf("etcd not found (apt-get install etcd-server): %w", err)
	}
	dir, err := os.MkdirTemp("", fmt.Sprintf("relay-bench-etcd-%d-", os.Getpid()))
	if err != nil {
		return nil, err
	}
	client, err := freeAddr()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	peer, err := freeAddr()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "etcd.log"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	defer logf.Close() // the child has its own descriptor
	e := &etcdProcess{dir: dir, endpoint: "http://" + client, done: make(chan struct{})}
	e.cmd = exec.Command("etcd", "--name", "relay-bench", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", "http://"+client, "--advertise-client-urls", "http://"+client,
		"--listen-peer-urls", "http://"+peer, "--initial-advertise-peer-urls", "http://"+peer,
		"--initial-cluster", "relay-bench=http://"+peer)
	e.cmd.Stdout, e.cmd.Stderr = logf, logf
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with the tool
	if err := e.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting etcd: %w", err)
	}
	go func() { e.cmd.Wait(); close(e.done) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := http.Get(e.endpoint + "/health")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return e, nil
			}
		}
		var why string
		select {
		case <-e.done:
			why = "etcd exited at start"
		case <-ctx.Done():
			why = ctx.Err().Error()
		default:
			if time.Now().After(deadline) {
				why = "etcd did not answer within 20 s"
			}
		}
		if why != "" {
			log := e.logTail()
			e.stop()
			return nil, fmt.Errorf("%s:\n%s", why, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *etcdProcess) pid() int { return e.cmd.Process.Pid }

func (e *etcdProcess) logTail() string {
	b, _ := os.ReadFile(filepath.Join(e.dir, "etcd.log"))
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return string(b)
}

// stop kills etcd, by its pid, and removes its directory.
func (e *etcdProcess) stop() {
	select {
	case <-e.done:
	default:
		e.cmd.Process.Kill()
		<-e.done
	}
	os.RemoveAll(e.dir)
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

// pgServer is the throwaway PostgreSQL (store/tempdb), with a database per run.
type pgServer struct{ *tempdb.Server }

func startPostgres(ctx context.Context) (*pgServer, error) {
	s, err := tempdb.Start(ctx, "relay-bench-pg")
	if err != nil {
		return nil, err
	}
	return &pgServer{s}, nil
}

// createDB creates an empty database and returns its DATABASE_URL.
func (p *pgServer) createDB(ctx context.Context, name string) (string, error) {
	db := sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(p.URL("postgres"))))
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	return p.URL(name), nil
}
