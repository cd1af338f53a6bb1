package browser

import (
	"net/http"
	"strings"
	"testing"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

func TestClientJSServedWithETag(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), nil)
	res, err := http.Get(ts.Base + "/client.js")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	etag := res.Header.Get("ETag")
	if res.StatusCode != 200 || etag == "" || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/javascript") {
		t.Fatalf("/client.js: %d %q %q", res.StatusCode, etag, res.Header.Get("Content-Type"))
	}
	expectNotModified(t, ts.Base+"/client.js", etag)
	for _, path := range []string{"/demo", "/demo.js", "/demo.css"} {
		if status, body := relaytest.GetText(t, ts.Base+path); status != 200 || body == "" {
			t.Fatalf("%s: %d", path, status)
		}
	}
}

// expectNotModified revalidates url with etag and wants 304.
func expectNotModified(t *testing.T, url, etag string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("If-None-Match", etag)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNotModified {
		t.Fatalf("%s revalidation: %d, want 304", url, res.StatusCode)
	}
}
