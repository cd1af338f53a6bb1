package client_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The SDKs are importable on their own: the Go client and the backend
// helpers never build the server's packages (actors, store, transport, the
// HTTP API) or its heavy dependencies (the actor system, the cluster, the
// database drivers).
func TestSDKsDoNotPullTheServer(t *testing.T) {
	server := []string{
		"github.com/relayhq/relay/actors", "github.com/relayhq/relay/store", "github.com/relayhq/relay/transport",
		"github.com/relayhq/relay/cmd/", "github.com/asynkron/", "github.com/uptrace/", "go.etcd.io/",
		"google.golang.org/grpc", "modernc.org/", "github.com/mattn/",
	}
	for _, pkg := range []string{"github.com/relayhq/relay/api/client", "github.com/relayhq/relay/api/backend"} {
		out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if dep != pkg && slices.ContainsFunc(append(server, "github.com/relayhq/relay/api"), func(p string) bool { return strings.HasPrefix(dep, p) }) {
				t.Errorf("%s imports %s", pkg, dep)
			}
		}
	}
}
