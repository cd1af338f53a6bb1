// Package tempdb runs a throwaway PostgreSQL cluster for the tests
// (store/storetest) and the load tool (cmd/relay-bench): initdb in a
// temporary directory named PREFIX-PID-…, listening only on a unix socket
// there, tuned for throwaway data (no fsync), run as the postgres user when
// the caller is root (PostgreSQL refuses to run as root). pg_ctl detaches
// the server, so a caller that dies without Stop leaves it running: the
// next Start with the same prefix stops the servers of callers that are
// gone, found by the PID in their directory's name.
package tempdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
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

// Server is a running throwaway cluster.
type Server struct {
	Bin  string // PostgreSQL's programs
	Dir  string // the temporary directory: socket, log and Data
	Data string
}

const options = "-c listen_addresses='' -k %s -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"

// Start starts a cluster in a new directory named prefix-PID-…, after
// stopping those a gone caller left under the same prefix, and returns
// once it answers.
func Start(ctx context.Context, prefix string) (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	stopStale(bin, prefix)
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s-%d-", prefix, os.Getpid()))
	if err != nil {
		return nil, err
	}
	s := &Server{Bin: bin, Dir: dir, Data: filepath.Join(dir, "data")}
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
	if out, err := run(filepath.Join(bin, "initdb"), "-D", s.Data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %v: %s", err, out)
	}
	if out, err := s.Ctl("start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "pg.log"))
		s.Stop()
		return nil, fmt.Errorf("pg_ctl start: %v: %s\n%s", err, out, log)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	db := sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(s.URL("postgres"))))
	defer db.Close()
	for {
		if err = db.PingContext(ctx); err == nil {
			return s, nil
		}
		if ctx.Err() != nil {
			s.Stop()
			return nil, fmt.Errorf("PostgreSQL did not answer: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Ctl runs pg_ctl on the cluster with its log, options and a 60 s wait,
// then args ("start", or "-m", "fast", "stop").
func (s *Server) Ctl(args ...string) ([]byte, error) {
	return run(append([]string{filepath.Join(s.Bin, "pg_ctl"), "-D", s.Data, "-l", filepath.Join(s.Dir, "pg.log"), "-w", "-t", "60",
		"-o", fmt.Sprintf(options, s.Dir)}, args...)...)
}

// URL is a DATABASE_URL for database name on the unix socket.
func (s *Server) URL(name string) string {
	return fmt.Sprintf("postgres://postgres@/%s?host=%s&sslmode=disable", name, filepath.Join(s.Dir, ".s.PGSQL.5432"))
}

// PID is the postmaster's, from postmaster.pid (0 if unreadable).
func (s *Server) PID() int {
	b, err := os.ReadFile(filepath.Join(s.Data, "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	n, _ := strconv.Atoi(strings.TrimSpace(line))
	return n
}

// Stop shuts the cluster down at once (pg_ctl stop -m immediate) and removes
// its directory.
func (s *Server) Stop() { stopAt(s.Bin, s.Dir) }

func stopAt(bin, dir string) {
	data := filepath.Join(dir, "data")
	if _, err := os.Stat(filepath.Join(data, "postmaster.pid")); err == nil {
		run(filepath.Join(bin, "pg_ctl"), "-D", data, "-w", "-t", "30", "-m", "immediate", "stop")
	}
	os.RemoveAll(dir)
}

// stopStale stops the clusters under prefix whose caller is gone.
func stopStale(bin, prefix string) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"-*-*"))
	for _, d := range dirs {
		owner, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(filepath.Base(d), prefix+"-"), "-", 2)[0])
		if err != nil || owner == os.Getpid() || syscall.Kill(owner, 0) != syscall.ESRCH {
			continue
		}
		stopAt(bin, d)
	}
}

// run executes one of PostgreSQL's programs, as the postgres user when the
// caller is root.
func run(args ...string) ([]byte, error) {
	if os.Geteuid() == 0 {
		return exec.Command("runuser", append([]string{"-u", "postgres", "--"}, args...)...).CombinedOutput()
	}
	return exec.Command(args[0], args[1:]...).CombinedOutput()
}

// BinDir finds the newest installed PostgreSQL programs (Debian layout
// first, then PATH).
func BinDir() (string, error) {
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
