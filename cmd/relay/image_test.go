package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// TestContainerImage builds cmd/relay/deploy/Containerfile with podman and
// checks what the image declares: a numeric non-root user, port 8080, the
// /data volume holding the SQLite store, /relay serve as what it runs, and
// the OCI labels (title, description, source, licenses, and the version and
// revision `make image` passes); then builds it for the other of amd64 and
// arm64 and checks the architecture it declares.
// The build context holds a stand-in for the binary (this test's own
// executable: the image is inspected, never run, and `make image` compiles
// the real static binary in about a minute, too long for a test), an empty
// data/ and a CA bundle, as `make image` assembles them.
//
// Where podman is not installed the test skips, unless RELAY_REQUIRE_PODMAN=1
// (set by .ci/run, which installs podman) makes that a failure.
func TestContainerImage(t *testing.T) {
	t.Parallel()
	podman, err := exec.LookPath("podman")
	if err != nil {
		if os.Getenv("RELAY_REQUIRE_PODMAN") == "1" {
			t.Fatal("RELAY_REQUIRE_PODMAN=1 but podman is not on PATH (apt-get install podman)")
		}
		t.Skip("podman is not on PATH: the container image is not built (set RELAY_REQUIRE_PODMAN=1 to make this a failure)")
	}
	ctxDir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	copyFile(t, self, filepath.Join(ctxDir, "relay"))
	if err := os.Mkdir(filepath.Join(ctxDir, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	ca := "/etc/ssl/certs/ca-certificates.crt"
	if _, err := os.Stat(ca); err != nil {
		ca = filepath.Join(ctxDir, "placeholder.crt")
		if err := os.WriteFile(ca, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(t, ca, filepath.Join(ctxDir, "ca-certificates.crt"))

	tag := fmt.Sprintf("localhost/relay-imagetest:%d-%d", os.Getpid(), time.Now().UnixNano())
	t.Cleanup(func() {
		if out, err := exec.Command(podman, "rmi", "-f", tag).CombinedOutput(); err != nil {
			t.Logf("podman rmi %s: %v\n%s", tag, err, out)
		}
	})
	// As `make image` builds it: its VERSION and REVISION as build arguments.
	build := exec.Command(podman, "build", "-q", "--format", "docker", "--build-arg", "VERSION=v9.8.7-test",
		"--build-arg", "REVISION=0123456789abcdef", "-f", filepath.Join("deploy", "Containerfile"), "-t", tag, ctxDir)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("podman build: %v\n%s", err, out)
	}
	images := inspectImage(t, podman, tag)
	c := images[0].Config
	wantLabels := map[string]string{
		"org.opencontainers.image.title":    "relay",
		"org.opencontainers.image.source":   "https://github.com/relayhq/relay",
		"org.opencontainers.image.licenses": "Apache-2.0",
		"org.opencontainers.image.version":  "v9.8.7-test",
		"org.opencontainers.image.revision": "0123456789abcdef",
	}
	for k, v := range wantLabels {
		if c.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, c.Labels[k], v)
		}
	}
	if !strings.Contains(c.Labels["org.opencontainers.image.description"], "pub/sub relay over WebSockets") {
		t.Errorf("label org.opencontainers.image.description = %q", c.Labels["org.opencontainers.image.description"])
	}
	if c.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532 (numeric, not root)", c.User)
	}
	if _, ok := c.ExposedPorts["8080/tcp"]; !ok || len(c.ExposedPorts) != 1 {
		t.Errorf("exposed ports %v, want 8080/tcp only", c.ExposedPorts)
	}
	if _, ok := c.Volumes["/data"]; !ok || len(c.Volumes) != 1 {
		t.Errorf("volumes %v, want /data only", c.Volumes)
	}
	if !slices.Equal(c.Entrypoint, []string{"/relay"}) || !slices.Equal(c.Cmd, []string{"serve"}) {
		t.Errorf("entrypoint %q cmd %q, want [/relay] [serve]", c.Entrypoint, c.Cmd)
	}
	if !slices.Contains(c.Env, "DATABASE_URL=sqlite:/data/relay.db") {
		t.Errorf("env %q lacks DATABASE_URL=sqlite:/data/relay.db", c.Env)
	}
	if h := images[0].Healthcheck; h == nil || !slices.Equal(h.Test, []string{"CMD", "/relay", "healthcheck"}) {
		t.Errorf("healthcheck %+v, want CMD /relay healthcheck", h)
	}

	// The other architecture `make image PLATFORMS="linux/amd64 linux/arm64"`
	// builds, from this machine: nothing runs in the build, so no emulation is
	// needed, and the image says which architecture it is for (--no-cache:
	// podman 4.3 would reuse the first build's layers, amd64 and all). (The binary
	// here is this machine's: the image is inspected, never run.) Without a
	// version the labels say unknown.
	other := "arm64"
	if runtime.GOARCH == "arm64" {
		other = "amd64"
	}
	otherTag := tag + "-" + other
	t.Cleanup(func() { exec.Command(podman, "rmi", "-f", otherTag).Run() })
	build = exec.Command(podman, "build", "-q", "--no-cache", "--format", "docker", "--platform", "linux/"+other,
		"-f", filepath.Join("deploy", "Containerfile"), "-t", otherTag, ctxDir)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("podman build --platform linux/%s: %v\n%s", other, err, out)
	}
	o := inspectImage(t, podman, otherTag)[0]
	if o.Architecture != other || o.Os != "linux" {
		t.Errorf("--platform linux/%s built %s/%s", other, o.Os, o.Architecture)
	}
	if v := o.Config.Labels["org.opencontainers.image.version"]; v != "unknown" {
		t.Errorf("version label without VERSION: %q, want unknown", v)
	}
}

// inspectedImage is what the tests read of `podman image inspect`.
type inspectedImage struct {
	Architecture string
	Os           string
	Config       struct {
		User         string
		ExposedPorts map[string]struct{}
		Volumes      map[string]struct{}
		Entrypoint   []string
		Cmd          []string
		Env          []string
		Labels       map[string]string
	}
	Healthcheck *struct{ Test []string } // beside Config in podman's inspect
}

func inspectImage(t *testing.T, podman, tag string) []inspectedImage {
	t.Helper()
	out, err := exec.Command(podman, "image", "inspect", tag).Output()
	if err != nil {
		t.Fatalf("podman image inspect %s: %v", tag, err)
	}
	var images []inspectedImage
	if err := json.Unmarshal(out, &images); err != nil || len(images) != 1 {
		t.Fatalf("podman image inspect %s: %v (%d images)\n%s", tag, err, len(images), out)
	}
	return images
}

// `relay healthcheck`, the image's HEALTHCHECK: ok against a serving relay
// on RELAY_ADDR's port, an error naming the address when nothing answers.
func TestHealthcheckCommand(t *testing.T) {
	t.Parallel()
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	_, port, _ := strings.Cut(ts.Addr(), ":")
	env := func(addr string) func(string) (string, bool) {
		return func(k string) (string, bool) {
			if k == "RELAY_ADDR" {
				return addr, true
			}
			return "", false
		}
	}
	var out strings.Builder
	if err := runCommandTo(context.Background(), []string{"healthcheck"}, env(":"+port), &out, io.Discard); err != nil || out.String() != "ok\n" {
		t.Fatalf("healthcheck of a serving relay: %v, printed %q", err, out.String())
	}
	// A relay on one address is asked there (on 127.0.0.2 here; a pod's IP
	// in production), not on 127.0.0.1, where nothing answers.
	one := startServer(t, storetest.SQLiteURL(t), map[string]string{"RELAY_ADDR": "127.0.0.2:0"})
	out.Reset()
	if err := runCommandTo(context.Background(), []string{"healthcheck"}, env(one.Addr()), &out, io.Discard); err != nil || out.String() != "ok\n" {
		t.Fatalf("healthcheck of a relay on %s: %v", one.Base, err)
	}
	free := relaytest.FreeAddr(t)
	_, freePort, _ := strings.Cut(free, ":")
	err := runCommandTo(context.Background(), []string{"healthcheck"}, env("0.0.0.0:"+freePort), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:"+freePort+"/healthz") {
		t.Fatalf("healthcheck with nothing listening: %v", err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}
