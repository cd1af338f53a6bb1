package backend_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/cookiejar"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"
)

// The examples run against a real relay: TestMain builds bin/relay from this
// module, starts it on a free loopback port with a throwaway SQLite file, and
// creates a project whose keys the examples use. Tests that need limits of
// their own start another relay from the same build (startOwnRelay).
var (
	emitURL   string
	secretKey string
	projectID string
	baseURL   string
	relayBin  string // built once by TestMain
)

func TestMain(m *testing.M) {
	os.Exit(runWithRelay(m))
}

func runWithRelay(m *testing.M) int {
	dir, err := os.MkdirTemp("", "relay-backend-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	relayBin = filepath.Join(dir, "relay")
	if out, err := exec.Command("go", "build", "-o", relayBin, "../../cmd/relay").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build relay: %v\n%s", err, out)
		return 1
	}
	p, err := startRelay(dir, "ALLOWED_SIGNUP_EMAILS=dev@example.com")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer p.stop()
	baseURL = p.base
	emitURL = baseURL + "/emit"
	if err := createProject(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// relayProcess is a started relayBin.
type relayProcess struct {
	cmd  *exec.Cmd
	base string     // http://ADDR of the public listener
	log  string     // the file its stderr goes to
	done chan error // Wait's result
}

func (p *relayProcess) logs() string { b, _ := os.ReadFile(p.log); return string(b) }

var listeningRe = regexp.MustCompile(`msg=listening listener=public addr=(\S+)`)

// startRelay starts relayBin with env on a free loopback port, with its
// SQLite file and its log in dir, and returns once it logs its public
// listener.
func startRelay(dir string, env ...string) (*relayProcess, error) {
	p := &relayProcess{log: filepath.Join(dir, "relay.log"), done: make(chan error, 1)}
	f, err := os.Create(p.log)
	if err != nil {
		return nil, err
	}
	stderr := &listenWatch{f: f, addr: make(chan string, 1)}
	p.cmd = exec.Command(relayBin, "serve")
	p.cmd.Env = append(append(os.Environ(), "RELAY_ADDR=127.0.0.1:0", "RELAY_DEBUG_ADDR=", "LOG_FORMAT=text",
		"DATABASE_URL=sqlite:"+filepath.Join(dir, "relay.db")), env...)
	p.cmd.Stderr = stderr
	if err := p.cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	go func() {
		err := p.cmd.Wait() // once the process has exited and its stderr is copied
		f.Close()
		p.done <- err
	}()
	select {
	case addr := <-stderr.addr:
		p.base = "http://" + addr
		return p, nil
	case err := <-p.done:
		return nil, fmt.Errorf("relay exited at start (%v):\n%s", err, p.logs())
	case <-time.After(60 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
		return nil, fmt.Errorf("relay did not start:\n%s", p.logs())
	}
}

// listenWatch copies the relay's stderr to its log file and, as the line
// naming the public listener is written, sends that address on addr (once).
// exec's one copying goroutine calls Write.
type listenWatch struct {
	f       *os.File
	addr    chan string // buffered 1
	partial []byte      // the line written so far, until the address is sent
	sent    bool
}

func (w *listenWatch) Write(b []byte) (int, error) {
	n, err := w.f.Write(b)
	if w.sent {
		return n, err
	}
	w.partial = append(w.partial, b...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		if m := listeningRe.FindSubmatch(w.partial[:i]); m != nil {
			w.addr <- string(m[1])
			w.sent, w.partial = true, nil
			break
		}
		w.partial = w.partial[i+1:]
	}
	return n, err
}

// stop interrupts the relay (SIGINT) and waits for it; one that has not
// exited 15 s later is killed and reported.
func (p *relayProcess) stop() error {
	p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
		return nil
	case <-time.After(15 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("relay did not stop on SIGINT:\n%s", p.logs())
	}
}

func createProject() error {
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar, Timeout: 10 * time.Second}
	res, err := hc.Post(baseURL+"/api/auth/signup", "application/json", bytes.NewBufferString(`{"email":"dev@example.com","password":"password123"}`))
	if err != nil {
		return err
	}
	res.Body.Close()
	res, err = hc.Post(baseURL+"/api/projects", "application/json", bytes.NewBufferString(`{"name":"examples"}`))
	if err != nil {
		return err
	}
	defer res.Body.Close()
	var out struct {
		Project struct{ ID string }
		Keys    struct{ SecretKey string }
	}
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		return err
	}
	projectID, secretKey = out.Project.ID, out.Keys.SecretKey
	return nil
}
