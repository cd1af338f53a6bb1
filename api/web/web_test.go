package web

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"testing"
)

// TestClientCrossOrigin: client.js and client.d.ts carry
// Access-Control-Allow-Origin: * (a page on another origin imports the
// module), on a 200 and on a 304; the demo's files carry no CORS header.
func TestClientCrossOrigin(t *testing.T) {
	mux := http.NewServeMux()
	Routes(mux)
	get := func(path, etag string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		r.Header.Set("Origin", "http://elsewhere.example")
		if etag != "" {
			r.Header.Set("If-None-Match", etag)
		}
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		return w
	}
	for _, path := range []string{"/client.js", "/client.d.ts"} {
		w := get(path, "")
		if w.Code != http.StatusOK || w.Header().Get("Access-Control-Allow-Origin") != "*" {
			t.Errorf("GET %s: %d, Access-Control-Allow-Origin %q, want 200 and *", path, w.Code, w.Header().Get("Access-Control-Allow-Origin"))
		}
		if w.Header().Get("Access-Control-Allow-Credentials") != "" {
			t.Errorf("GET %s: Access-Control-Allow-Credentials set", path)
		}
		w = get(path, w.Header().Get("ETag"))
		if w.Code != http.StatusNotModified || w.Header().Get("Access-Control-Allow-Origin") != "*" {
			t.Errorf("GET %s revalidated: %d, Access-Control-Allow-Origin %q, want 304 and *", path, w.Code, w.Header().Get("Access-Control-Allow-Origin"))
		}
	}
	for _, path := range []string{"/demo", "/demo.js", "/demo.css"} {
		if w := get(path, ""); w.Code != http.StatusOK || len(w.Header().Values("Access-Control-Allow-Origin")) != 0 {
			t.Errorf("GET %s: %d, Access-Control-Allow-Origin %q, want 200 and none", path, w.Code, w.Header().Values("Access-Control-Allow-Origin"))
		}
	}
}

// TestPackageJSON: package.json describes a publishable package (not
// private, an ES module, a version) whose exports, types and files exist
// here, client.js and client.d.ts among them.
func TestPackageJSON(t *testing.T) {
	b, err := os.ReadFile("package.json")
	if err != nil {
		t.Fatal(err)
	}
	var pkg struct {
		Name, Version, Type, License, Main, Types string
		Private                                   *bool
		Exports                                   map[string]json.RawMessage
		Files                                     []string
		Repository                                struct{ Type, URL, Directory string }
		PublishConfig                             struct{ Access string }
	}
	if err := json.Unmarshal(b, &pkg); err != nil {
		t.Fatal(err)
	}
	if pkg.Private != nil {
		t.Errorf(`"private": %v: the package is published (npm publish refuses a private one)`, *pkg.Private)
	}
	if pkg.Name != "@relayhq/client" || pkg.Type != "module" || pkg.License != "Apache-2.0" {
		t.Errorf("name %q type %q license %q, want @relayhq/client, module, Apache-2.0", pkg.Name, pkg.Type, pkg.License)
	}
	if !regexp.MustCompile(`^\d+\.\d+\.\d+$`).MatchString(pkg.Version) {
		t.Errorf("version %q is not MAJOR.MINOR.PATCH", pkg.Version)
	}
	if pkg.PublishConfig.Access != "public" {
		t.Errorf(`publishConfig.access %q: a scoped package is published restricted unless "public"`, pkg.PublishConfig.Access)
	}
	if pkg.Repository.URL == "" || pkg.Repository.Directory != "api/web" {
		t.Errorf("repository %+v, want the repository's URL and directory api/web", pkg.Repository)
	}
	var root struct{ Types, Default string }
	if err := json.Unmarshal(pkg.Exports["."], &root); err != nil {
		t.Fatalf(`exports ".": %v`, err)
	}
	if root.Default != "./client.js" || root.Types != "./client.d.ts" || pkg.Main != "client.js" || pkg.Types != "client.d.ts" {
		t.Errorf(`exports "." %+v, main %q, types %q: want client.js and client.d.ts`, root, pkg.Main, pkg.Types)
	}
	for _, f := range []string{root.Default, root.Types, pkg.Main, pkg.Types} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("package.json names %s: %v", f, err)
		}
	}
	listed := map[string]bool{}
	for _, f := range pkg.Files {
		listed[f] = true
		if f == "LICENSE" {
			continue // copied from the repository's root by the prepack script
		}
		if _, err := os.Stat(f); err != nil {
			t.Errorf("files lists %s: %v", f, err)
		}
	}
	if !listed["client.js"] || !listed["client.d.ts"] || !listed["LICENSE"] {
		t.Errorf("files %q lack client.js, client.d.ts or LICENSE", pkg.Files)
	}
	if _, err := os.Stat("../../LICENSE"); err != nil {
		t.Errorf("the prepack script copies ../../LICENSE: %v", err)
	}
}
