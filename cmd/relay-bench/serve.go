package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// relayProcess is a relay the tool started itself (for `suite`, `cluster`
// and the tests): the binary on a throwaway SQLite file in a temporary
// directory (unless env names another DATABASE_URL), on a free loopback
// port, with no operator listener unless env asks for one
// (RELAY_DEBUG_ADDR=127.0.0.1:0).
type relayProcess struct {
	cmd   *exec.Cmd
	dir   string
	base  string
	debug string // the operator listener's base URL, when env enabled it
	pid   int
	done  chan struct{}

	logMu sync.Mutex
	log   bytes.Buffer
}

// startRelay starts bin serve with env added to the usual environment and
// waits for its public listener's ready line.
func startRelay(bin string, env ...string) (*relayProcess, error) {
	return startServer(bin, []string{"serve"}, env...)
}

// startServer is startRelay for any command that logs the relay's ready
// line (relay-bench naive does).
func startServer(bin string, args []string, env ...string) (*relayProcess, error) {
	dir, err := os.MkdirTemp("", "relay-bench")
	if err != nil {
		return nil, err
	}
	r := &relayProcess{dir: dir, done: make(chan struct{})}
	r.cmd = exec.Command(bin, args...)
	r.cmd.Env = append(os.Environ(),
		"DATABASE_URL=sqlite:"+filepath.Join(dir, "relay.db"),
		"RELAY_ADDR=127.0.0.1:0",
		"RELAY_DEBUG_ADDR=",
		"ALLOWED_SIGNUP_EMAILS=bench@example.com",
	)
	r.cmd.Env = append(r.cmd.Env, env...)
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with the tool
	debugOn := false
	for _, kv := range r.cmd.Env { // the last one counts, as for exec
		if v, ok := strings.CutPrefix(kv, "RELAY_DEBUG_ADDR="); ok {
			debugOn = v != ""
		}
	}
	stderr, err := r.cmd.StderrPipe()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := r.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting the relay: %w", err)
	}
	r.pid = r.cmd.Process.Pid
	go func() { r.cmd.Wait(); close(r.done) }()

	// The ready line reads `msg=listening listener=public addr=127.0.0.1:PORT`
	// (then listener=debug for the operator listener); the rest of the log is
	// kept for a failure report.
	addr, debugAddr := make(chan string, 1), make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			r.logMu.Lock()
			r.log.WriteString(line + "\n")
			r.logMu.Unlock()
			if !strings.Contains(line, "msg=listening") {
				continue
			}
			to := addr
			if strings.Contains(line, "listener=debug") {
				to = debugAddr
			} else if !strings.Contains(line, "listener=public") {
				continue
			}
			if _, a, ok := strings.Cut(line, " addr="); ok {
				select {
				case to <- strings.Fields(a)[0]:
				default:
				}
			}
		}
		io.Copy(io.Discard, stderr)
	}()
	timeout := time.After(30 * time.Second)
wait:
	for r.base == "" || (debugOn && r.debug == "") {
		select {
		case a := <-addr:
			r.base = "http://" + a
		case a := <-debugAddr:
			r.debug = "http://" + a
		case <-r.done:
			err = errors.New("the relay exited before it listened")
			break wait
		case <-timeout:
			err = errors.New("the relay did not listen within 30 s")
			break wait
		}
	}
	if err == nil {
		return r, nil
	}
	r.stop()
	return nil, fmt.Errorf("%w:\n%s", err, r.logText())
}

func (r *relayProcess) logText() string {
	r.logMu.Lock()
	defer r.logMu.Unlock()
	return r.log.String()
}

// stop interrupts the relay (a graceful shutdown), kills it if it has not
// exited after 20 s, and removes its directory.
func (r *relayProcess) stop() {
	r.cmd.Process.Signal(os.Interrupt)
	select {
	case <-r.done:
	case <-time.After(20 * time.Second):
		r.cmd.Process.Kill()
		<-r.done
	}
	os.RemoveAll(r.dir)
}
