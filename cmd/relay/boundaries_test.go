package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/relayhq/relay/actors"
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
	t.Parallel()
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
	t.Parallel()
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
// users do, through its listeners: no file there imports a package of the
// server, whatever its build tags. What they may use: the harness, storetest
// (a throwaway PostgreSQL), the client-facing wire shapes (proto) and the
// client libraries; and the cluster suite alone the cluster port's protocol
// (proto/clusterpb), which its attack tests speak. The harness they use is
// held to the same rule, so that nothing of the server comes in through it;
// it may also use actors/clustertls, a certificate library with no server
// state, to make etcd's certificates.
func TestEndToEndSuitesStayOutside(t *testing.T) {
	t.Parallel()
	bad, err := e2eViolations("e2e")
	if err != nil {
		t.Fatal(err)
	}
	harness, err := e2eViolations("internal/relaytest", module+"/actors/clustertls")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range append(bad, harness...) {
		t.Error(v + ": an end-to-end suite reaches the relay only through its listeners")
	}
}

// The check itself: a file with any build tag is read, and only the
// allowed packages pass; the cluster port's protocol only in the cluster
// suite; an exception only where it is given.
func TestEndToEndCheckCatchesAWrongImport(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := func(pkg string, imports ...string) string {
		os.MkdirAll(filepath.Join(dir, pkg), 0o755)
		path := filepath.Join(dir, pkg, "a_test.go")
		src := "//go:build " + pkg + "\n\npackage " + pkg + "\n\nimport (\n\t\"testing\"\n"
		for _, p := range imports {
			src += "\t\"" + module + p + "\"\n"
		}
		os.WriteFile(path, []byte(src+")\n"), 0o644)
		return path
	}
	chaos := file("chaos", "/actors", "/proto/clusterpb", "/proto", "/cmd/relay/internal/relaytest")
	cluster := file("cluster", "/actors", "/proto/clusterpb", "/cmd/relay/internal/relaytest")
	got, err := e2eViolations(dir)
	want := []string{chaos + " imports " + module + "/actors", chaos + " imports " + module + "/proto/clusterpb",
		cluster + " imports " + module + "/actors"}
	if err != nil || strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("violations = %q (%v), want %q", got, err, want)
	}
	// An exception given for one directory (the harness's certificate
	// library) passes there only.
	got, err = e2eViolations(filepath.Join(dir, "chaos"), module+"/actors")
	if want := []string{chaos + " imports " + module + "/proto/clusterpb"}; err != nil || strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("with actors allowed: violations = %q (%v), want %q", got, err, want)
	}
}

// e2eViolations reads the imports of every Go file under dir, build tags
// ignored, and lists those of this module an end-to-end suite may not use
// (extra: more it may).
func e2eViolations(dir string, extra ...string) ([]string, error) {
	allowed := append([]string{module + "/cmd/relay/internal/relaytest", module + "/cmd/relay/e2e", module + "/store/storetest",
		module + "/api/client", module + "/api/backend"}, extra...)
	var out []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
			return err
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		clusterSuite := under(filepath.ToSlash(path), filepath.ToSlash(filepath.Join(dir, "cluster")))
	next:
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if !under(p, module) || p == module+"/proto" || clusterSuite && p == module+"/proto/clusterpb" {
				continue
			}
			for _, a := range allowed {
				if under(p, a) {
					continue next
				}
			}
			out = append(out, path+" imports "+p)
		}
		return nil
	})
	return out, err
}

// The cluster suite names the cluster port's actors as an attacker would
// learn them, by value; they must be the names the relay uses, or its
// attack tests would aim at actors that do not exist and pass.
func TestClusterSuiteNamesTheRelaysActors(t *testing.T) {
	t.Parallel()
	f, err := parser.ParseFile(token.NewFileSet(), "e2e/cluster/main_test.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, d := range f.Decls {
		if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.CONST {
			for _, spec := range g.Specs {
				v := spec.(*ast.ValueSpec)
				for i, name := range v.Names {
					if lit, ok := v.Values[i].(*ast.BasicLit); ok {
						got[name.Name], _ = strconv.Unquote(lit.Value)
					}
				}
			}
		}
	}
	want := map[string]string{"nodeActorName": actors.NodeActorName, "channelKind": actors.ChannelKind}
	if !maps.Equal(got, want) {
		t.Errorf("e2e/cluster's constants %v, want %v", got, want)
	}
}
