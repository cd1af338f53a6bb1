package relaytest

import (
	"bytes"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Buffer collects a process's or a logger's output; safe for concurrent use.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Process is the real relay binary serving on loopback.
type Process struct {
	Cmd    *exec.Cmd
	Base   string        // http://ADDR of the public listener
	Debug  string        // http://ADDR of the operator listener; "" when RELAY_DEBUG_ADDR is empty
	Logs   *Buffer       // its whole stderr
	Exited chan struct{} // closed once it has exited (Cmd.ProcessState is then set)
}

// The ready lines start prints (one per listener, once ready), in text format.
var (
	publicRe = regexp.MustCompile(`msg=listening listener=public addr=(\S+)`)
	debugRe  = regexp.MustCompile(`msg=listening listener=debug addr=(\S+)`)
)

// StartBinary starts `relay serve` in a temp dir with the defaults below,
// then env (KEY=VALUE, later ones win), and returns once it has printed its
// listening lines. The process is killed, by its pid, when the test ends
// unless it has exited by then. Defaults: both listeners on free loopback
// ports, a fresh SQLite file, text logs at info, signup open to
// alice@example.com.
func StartBinary(t testing.TB, env ...string) *Process {
	t.Helper()
	return startProcess(t, relayBinary, env)
}

// StartBinaryAs is StartBinary as the user uid in the group gid (the test
// runs as root), so that firewall rules can match the process's packets by
// owner: a partition. The files it must read (its binary, working
// directory, certificates and keys, the PostgreSQL socket's directory) and
// the temporary directories above them are opened to gid, which should be
// a group of no one else's.
func StartBinaryAs(t testing.TB, uid, gid int, env ...string) *Process {
	t.Helper()
	return startProcessAs(t, relayBinary, env, &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)})
}

// startProcess is StartBinary with the binary build makes.
func startProcess(t testing.TB, build func() (string, error), env []string) *Process {
	t.Helper()
	return startProcessAs(t, build, env, nil)
}

// startProcessAs is startProcess as the user of cred (nil: this process's).
func startProcessAs(t testing.TB, build func() (string, error), env []string, cred *syscall.Credential) *Process {
	t.Helper()
	p := &Process{Cmd: serveCommand(t, build, env), Logs: &Buffer{}, Exited: make(chan struct{})}
	if cred != nil {
		p.Cmd.SysProcAttr.Credential = cred
		openTo(t, p.Cmd)
	}
	debugOn := true
	for _, kv := range p.Cmd.Env { // the last one counts, as for exec
		if v, ok := strings.CutPrefix(kv, "RELAY_DEBUG_ADDR="); ok {
			debugOn = v != ""
		}
	}
	p.Cmd.Stderr = p.Logs
	if err := p.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.Cmd.Wait(); close(p.Exited) }()
	t.Cleanup(func() {
		select {
		case <-p.Exited:
		default:
			syscall.Kill(p.Cmd.Process.Pid, syscall.SIGKILL)
			<-p.Exited
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		logs := p.Logs.String()
		m, d := publicRe.FindStringSubmatch(logs), debugRe.FindStringSubmatch(logs)
		if m != nil && (d != nil || !debugOn) {
			p.Base = "http://" + m[1]
			if d != nil {
				p.Debug = "http://" + d[1]
			}
			return p
		}
		select {
		case <-p.Exited:
			t.Fatalf("relay exited at start:\n%s", logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("relay did not start within 30 s:\n%s", logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// serveCommand is `relay serve` in a fresh temp dir with StartBinary's
// defaults, then env.
func serveCommand(t testing.TB, build func() (string, error), env []string) *exec.Cmd {
	t.Helper()
	bin, err := build()
	if err != nil {
		t.Fatalf("build relay: %v", err)
	}
	dir := t.TempDir()
	cmd := exec.Command(bin, "serve")
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // a test binary that crashes leaves no relay behind
	cmd.Env = append(hostEnv(), append([]string{
		"RELAY_ADDR=127.0.0.1:0", "RELAY_DEBUG_ADDR=127.0.0.1:0", "LOG_FORMAT=text",
		"DATABASE_URL=sqlite:" + filepath.Join(dir, "relay.db"), "ALLOWED_SIGNUP_EMAILS=alice@example.com",
	}, env...)...)
	return cmd
}

// openTo opens what cmd reads to its group: its binary, its working
// directory (writable too), the certificate files its environment names and
// the PostgreSQL socket's directory, with the directories above them up to
// the system's temporary directory. They are a test's temporary files.
func openTo(t testing.TB, cmd *exec.Cmd) {
	t.Helper()
	gid := int(cmd.SysProcAttr.Credential.Gid)
	paths := []string{cmd.Path, cmd.Dir}
	for _, kv := range cmd.Env {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "RELAY_CLUSTER_") && (strings.HasSuffix(k, "_CA") || strings.HasSuffix(k, "_CERT") || strings.HasSuffix(k, "_KEY")):
			paths = append(paths, v)
		case k == "DATABASE_URL":
			if u, err := url.Parse(v); err == nil && u.Query().Get("host") != "" {
				paths = append(paths, filepath.Dir(u.Query().Get("host"))) // the socket's directory
			}
		}
	}
	top := filepath.Clean(os.TempDir())
	for _, path := range paths {
		for p := filepath.Clean(path); p != top && strings.HasPrefix(p, top+string(filepath.Separator)); p = filepath.Dir(p) {
			st, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			add := os.FileMode(0o040) // read
			if st.IsDir() {
				add = 0o050 // list and enter
			}
			if p == cmd.Dir {
				add = 0o070
			}
			keep := st.Mode() & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky)
			if err := os.Chown(p, -1, gid); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, keep|add); err != nil { // a chown clears setuid and setgid: set them back
				t.Fatal(err)
			}
		}
	}
}

// Binary is the path of cmd/relay built for this test process.
func Binary(t testing.TB) string {
	t.Helper()
	bin, err := relayBinary()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// hostEnv is what a relay the harness starts takes from the test's own
// environment: where programs, home and temporary files are, the time zone,
// the TLS roots and PostgreSQL's own defaults (PG*, which a database URL may
// leave to them); never a relay setting (RELAY_*, DATABASE_URL, …), which
// would change what every test checks, nor GORACE, which could divert the
// race detector's reports from the log the harness reads.
func hostEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case k == "PATH", k == "HOME", k == "TMPDIR", k == "TZ", k == "SSL_CERT_FILE", k == "SSL_CERT_DIR", strings.HasPrefix(k, "PG"):
			out = append(out, kv)
		}
	}
	return out
}

// relayBinary builds cmd/relay once per test binary, into a directory named after
// this process; directories left by earlier test processes that are gone
// are removed first. raceBinary is the same build with the race detector.
var (
	relayBinary = sync.OnceValues(func() (string, error) { return build("relay") })
	raceBinary  = sync.OnceValues(func() (string, error) { return build("relay-race", "-race") })
)

func build(name string, flags ...string) (string, error) {
	dir, err := buildDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, name)
	args := append(append([]string{"build"}, flags...), "-o", bin, "github.com/relayhq/relay/cmd/relay")
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("%v: %s", err, out)
	}
	return bin, nil
}

var buildDir = sync.OnceValues(func() (string, error) {
	tmp := os.TempDir()
	stale, _ := filepath.Glob(filepath.Join(tmp, "relaytest-*"))
	for _, d := range stale {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(d), "relaytest-"))
		if err == nil && (pid == os.Getpid() || syscall.Kill(pid, 0) == syscall.ESRCH) {
			os.RemoveAll(d)
		}
	}
	dir := filepath.Join(tmp, "relaytest-"+strconv.Itoa(os.Getpid()))
	return dir, os.MkdirAll(dir, 0o755)
})

// RSS is a process's resident set size in KiB, from /proc.
func RSS(t testing.TB, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseFloat(strings.Fields(v)[0], 64)
			return n
		}
	}
	t.Fatalf("no VmRSS for pid %d", pid)
	return 0
}

// StartBinaryFile is StartBinary with a relay binary built elsewhere: another
// version of the relay, for a rolling upgrade.
func StartBinaryFile(t testing.TB, bin string, env ...string) *Process {
	t.Helper()
	return startProcess(t, func() (string, error) { return bin, nil }, env)
}
