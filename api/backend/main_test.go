package backend_test

import (
	"bufio"
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
// creates a project whose keys the examples use.
var (
	emitURL   string
	secretKey string
	projectID string
	baseURL   string
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
	bin := filepath.Join(dir, "relay")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/relay").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build relay: %v\n%s", err, out)
		return 1
	}
	cmd := exec.Command(bin, "serve")
	cmd.Env = append(os.Environ(), "RELAY_ADDR=127.0.0.1:0", "RELAY_DEBUG_ADDR=", "DATABASE_URL=sqlite:"+filepath.Join(dir, "relay.db"),
		"ALLOWED_SIGNUP_EMAILS=dev@example.com")
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	}()
	addr := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`msg=listening listener=public addr=(\S+)`)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
	}()
	select {
	case a := <-addr:
		baseURL = "http://" + a
	case <-time.After(60 * time.Second):
		fmt.Fprintln(os.Stderr, "relay did not start")
		return 1
	}
	emitURL = baseURL + "/emit"
	if err := createProject(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
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
