package main

import (
	"net/http"
	"strings"
	"testing"

	"github.com/relayhq/relay/store/storetest"
)

func TestClientJSServedWithETag(t *testing.T) {
	ts := startServer(t, storetest.SQLiteURL(t), nil)
	res, err := http.Get(ts.base + "/client.js")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	etag := res.Header.Get("ETag")
	if res.StatusCode != 200 || etag == "" || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/javascript") {
		t.Fatalf("/client.js: %d %q %q", res.StatusCode, etag, res.Header.Get("Content-Type"))
	}
	req, _ := http.NewRequest("GET", ts.base+"/client.js", nil)
	req.Header.Set("If-None-Match", etag)
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNotModified {
		t.Fatalf("revalidation: %d, want 304", res.StatusCode)
	}
	for _, path := range []string{"/demo", "/demo.js", "/demo.css"} {
		if status, body := getText(t, ts.base+path); status != 200 || body == "" {
			t.Fatalf("%s: %d", path, status)
		}
	}
}
