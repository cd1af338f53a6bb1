package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The package table of the design: who may depend on whom. Each rule names a
// package of this module, the packages it must not depend on directly or
// through another (deps), and the libraries it must not import itself
// (imports: what it may use only through the package that owns it, say
// WebSocket framing through transport). Paths match as prefixes. Test files
// are not checked.
const module = "github.com/relayhq/relay"

type boundary struct {
	pkg, why      string
	deps, imports []string
}

var boundaries = []boundary{
	{"transport", "sockets know nothing of projects, channels or storage",
		[]string{module + "/actors", module + "/store", module + "/api", module + "/cmd"}, nil},
	{"actors", "actors never touch SQL or HTTP; WebSocket framing is the transport's",
		[]string{module + "/store", module + "/api", module + "/cmd", "github.com/uptrace/bun"},
		[]string{"database/sql", "net/http", "github.com/gobwas/ws"}},
	{"proto", "wire shapes import nothing of ours", []string{module}, nil},
	{"proto/clusterpb", "messages between nodes import nothing of ours", []string{module}, nil},
	{"store", "storage neither caches nor decides policy",
		[]string{module + "/actors", module + "/api", module + "/transport", module + "/cmd"}, nil},
	{"api/client", "the Go client is usable without the server",
		[]string{module + "/actors", module + "/store", module + "/transport", module + "/api/webhook", "github.com/uptrace/bun", "github.com/asynkron"}, nil},
	{"api/backend", "the backend helpers are usable without the server",
		[]string{module + "/actors", module + "/store", module + "/transport", "github.com/uptrace/bun", "github.com/asynkron"}, nil},
}

// pkgDeps is one package's non-test dependencies: direct and transitive.
type pkgDeps struct{ imports, deps []string }

func under(path, prefix string) bool { return path == prefix || strings.HasPrefix(path, prefix+"/") }

// violations lists "pkg → dep (why)" for every forbidden dependency.
func violations(all map[string]pkgDeps) []string {
	var out []string
	check := func(b boundary, have, forbidden []string) {
		for _, d := range have {
			for _, f := range forbidden {
				if under(d, f) && !under(d, module+"/"+b.pkg) {
					out = append(out, b.pkg+" → "+d+" ("+b.why+")")
				}
			}
		}
	}
	for _, b := range boundaries {
		p := all[module+"/"+b.pkg]
		check(b, p.deps, b.deps)
		check(b, p.imports, b.imports)
	}
	return out
}

func TestImportBoundaries(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}|{{join .Imports " "}}|{{join .Deps " "}}`, module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	all := map[string]pkgDeps{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "|")
		all[f[0]] = pkgDeps{imports: strings.Fields(f[1]), deps: strings.Fields(f[2])}
	}
	for _, b := range boundaries {
		if _, ok := all[module+"/"+b.pkg]; !ok {
			t.Errorf("package %s is gone: update the rule", b.pkg)
		}
	}
	for _, v := range violations(all) {
		t.Error("forbidden dependency: " + v)
	}
}

// The check itself: a wrong import is caught, directly or through another package.
func TestImportBoundariesCatchAWrongImport(t *testing.T) {
	all := map[string]pkgDeps{
		module + "/transport": {deps: []string{"net/http", module + "/api/web", module + "/store"}},
		module + "/proto":     {imports: []string{"encoding/json"}, deps: []string{"encoding/json"}},
		module + "/actors": {imports: []string{module + "/transport", "github.com/gobwas/ws/wsutil"},
			deps: []string{module + "/transport", "github.com/gobwas/ws", "github.com/gobwas/ws/wsutil"}},
	}
	got := violations(all)
	want := []string{"transport → " + module + "/api/web", "transport → " + module + "/store", "actors → github.com/gobwas/ws/wsutil"}
	ok := len(got) == len(want)
	for i := 0; ok && i < len(want); i++ {
		ok = strings.HasPrefix(got[i], want[i]+" (")
	}
	if !ok {
		t.Errorf("violations = %q", got)
	}
}

// The end-to-end suites under cmd/relay/e2e reach the relay only as its
// users do, through its listeners: their tests import none of the server's
// packages. What they may use: the harness, storetest (a throwaway
// PostgreSQL), the wire shapes and the client libraries.
func TestEndToEndSuitesStayOutside(t *testing.T) {
	out, err := exec.Command("go", "list", "-tags", "cluster,soak,worstcase",
		"-f", `{{.ImportPath}}|{{join .TestImports " "}} {{join .XTestImports " "}} {{join .Imports " "}}`, module+"/cmd/relay/e2e/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	allowed := []string{module + "/cmd/relay/internal/relaytest", module + "/store/storetest", module + "/proto",
		module + "/api/client", module + "/api/backend"}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, "|")
	next:
		for _, imp := range strings.Fields(imports) {
			if !under(imp, module) {
				continue
			}
			for _, a := range allowed {
				if under(imp, a) {
					continue next
				}
			}
			t.Errorf("%s imports %s: an end-to-end suite reaches the relay only through its listeners", pkg, imp)
		}
	}
}
