package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/uptrace/bun/driver/pgdriver"
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

// pgServer is a throwaway PostgreSQL cluster: initdb in a temporary
// directory, listening on a unix socket there only, no fsync (as
// store/storetest starts it for the tests; that package wants a testing.TB
// and stops its server from TestMain, so it is not reused here). Run as the
// postgres user when the tool runs as root.
type pgServer struct {
	bin  string
	dir  string
	data string
}

const pgOptions = "-c listen_addresses='' -k %s -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"

func startPostgres(ctx context.Context) (*pgServer, error) {
	bin, err := pgBinDir()
	if err != nil {
		return nil, err
	}
	stopStalePostgres(bin)
	dir, err := os.MkdirTemp("", fmt.Sprintf("relay-bench-pg-%d-", os.Getpid()))
	if err != nil {
		return nil, err
	}
	p := &pgServer{bin: bin, dir: dir, data: filepath.Join(dir, "data")}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("running as root needs a postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	if out, err := p.run("initdb", "-D", p.data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %v: %s", err, out)
	}
	if out, err := p.run("pg_ctl", "-D", p.data, "-l", filepath.Join(dir, "pg.log"), "-w", "-t", "60",
		"-o", fmt.Sprintf(pgOptions, dir), "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "pg.log"))
		p.stop()
		return nil, fmt.Errorf("pg_ctl start: %v: %s\n%s", err, out, log)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	db := sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(p.url("postgres"))))
	defer db.Close()
	for {
		if err = db.PingContext(ctx); err == nil {
			return p, nil
		}
		if ctx.Err() != nil {
			p.stop()
			return nil, fmt.Errorf("PostgreSQL did not answer: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// run executes one of PostgreSQL's programs, as the postgres user when the
// tool is root (PostgreSQL refuses to run as root).
func (p *pgServer) run(prog string, args ...string) ([]byte, error) {
	return runPG(filepath.Join(p.bin, prog), args...)
}

func runPG(path string, args ...string) ([]byte, error) {
	if os.Geteuid() == 0 {
		return exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...).CombinedOutput()
	}
	return exec.Command(path, args...).CombinedOutput()
}

// url is a DATABASE_URL for database name on the unix socket.
func (p *pgServer) url(name string) string {
	return fmt.Sprintf("postgres://postgres@/%s?host=%s&sslmode=disable", name, filepath.Join(p.dir, ".s.PGSQL.5432"))
}

// createDB creates an empty database and returns its DATABASE_URL.
func (p *pgServer) createDB(ctx context.Context, name string) (string, error) {
	db := sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(p.url("postgres"))))
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	return p.url(name), nil
}

// pid is the postmaster's, from postmaster.pid (0 if unreadable).
func (p *pgServer) pid() int {
	b, err := os.ReadFile(filepath.Join(p.data, "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	n, _ := strconv.Atoi(strings.TrimSpace(line))
	return n
}

// stop shuts the cluster down at once (pg_ctl stop -m immediate) and removes
// its directory.
func (p *pgServer) stop() {
	if _, err := os.Stat(filepath.Join(p.data, "postmaster.pid")); err == nil {
		p.run("pg_ctl", "-D", p.data, "-w", "-t", "30", "-m", "immediate", "stop")
	}
	os.RemoveAll(p.dir)
}

// stopStalePostgres stops the PostgreSQL of an earlier relay-bench that is no
// longer running (killed before it could stop its own), found by its
// directory's name, and removes the directory.
func stopStalePostgres(bin string) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "relay-bench-pg-*"))
	for _, d := range dirs {
		f := strings.SplitN(strings.TrimPrefix(filepath.Base(d), "relay-bench-pg-"), "-", 2)
		owner, err := strconv.Atoi(f[0])
		if err != nil || owner == os.Getpid() || syscall.Kill(owner, 0) != syscall.ESRCH {
			continue
		}
		data := filepath.Join(d, "data")
		if _, err := os.Stat(filepath.Join(data, "postmaster.pid")); err == nil {
			runPG(filepath.Join(bin, "pg_ctl"), "-D", data, "-w", "-t", "30", "-m", "immediate", "stop")
		}
		os.RemoveAll(d)
	}
}

// pgBinDir finds the newest installed PostgreSQL programs (Debian layout
// first, then PATH).
func pgBinDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	version := func(dir string) int {
		v, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
		return v
	}
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) < version(dirs[j]) })
	if len(dirs) > 0 {
		return dirs[len(dirs)-1], nil
	}
	p, err := exec.LookPath("initdb")
	if err != nil {
		return "", errors.New("no PostgreSQL programs in /usr/lib/postgresql/*/bin or PATH (apt-get install postgresql)")
	}
	return filepath.Dir(p), nil
}
