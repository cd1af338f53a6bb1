package wire

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// TestPlainGetOnWS: a GET /ws that asks for no WebSocket (a browser's address
// bar, curl) answers 400 in plain text saying what the endpoint is, and closes
// its connection. The handshake's own answers stay as they were: the key and
// the connection caps are checked first, for every request; a request that
// does ask for a WebSocket but gets the handshake wrong is the upgrader's.
func TestPlainGetOnWS(t *testing.T) {
	t.Parallel()
	ts := relaytest.Start(t, storetest.SQLiteURL(t), nil)
	owner := ts.Signup("alice@example.com")
	p := owner.CreateProject("demo")
	addr := ts.Addr()
	// exchange sends one request on a new connection and reads the answer,
	// then (closes) whether the server closes the connection after it.
	exchange := func(request string, closes bool) (*http.Response, string, error) {
		t.Helper()
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(conn, request); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(conn)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if !closes {
			return res, string(body), nil
		}
		_, after := br.ReadByte() // io.EOF: the server closed the connection
		return res, string(body), after
	}
	head := func(query string) string {
		return "GET /ws" + query + " HTTP/1.1\r\nHost: " + addr + "\r\n"
	}

	for _, query := range []string{"?publicKey=" + p.PublicKey, "?publicKey=" + p.PublicKey + "&x=1"} {
		res, body, after := exchange(head(query)+"Accept: text/html\r\n\r\n", true)
		if res.StatusCode != http.StatusBadRequest || res.Header.Get("Content-Type") != "text/plain; charset=utf-8" {
			t.Fatalf("plain GET /ws%s: %d %q", query, res.StatusCode, res.Header.Get("Content-Type"))
		}
		for _, want := range []string{"WebSocket endpoint", "Upgrade: websocket", "/client.js", "proto/PROTOCOL.md"} {
			if !strings.Contains(body, want) {
				t.Errorf("plain GET /ws: body %q does not say %q", body, want)
			}
		}
		if res.Header.Get("Cache-Control") != "no-store" || !res.Close || after != io.EOF {
			t.Fatalf("plain GET /ws: Cache-Control %q, Connection close %v, then %v; want no-store and the connection closed",
				res.Header.Get("Cache-Control"), res.Close, after)
		}
	}
	// An Upgrade header naming something else is no WebSocket either.
	if res, body, _ := exchange(head("?publicKey="+p.PublicKey)+"Connection: Upgrade\r\nUpgrade: h2c\r\n\r\n", true); res.StatusCode != 400 || !strings.Contains(body, "WebSocket endpoint") {
		t.Fatalf("Upgrade: h2c: %d %q", res.StatusCode, body)
	}
	// Asking for a WebSocket with a bad handshake: the upgrader's answer.
	if res, body, _ := exchange(head("?publicKey="+p.PublicKey)+"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\r\n", true); res.StatusCode != 400 || strings.Contains(body, "WebSocket endpoint") {
		t.Fatalf("a WebSocket request without Sec-WebSocket-Key: %d %q, want the upgrader's 400", res.StatusCode, body)
	}

	// The key is checked first, as for a handshake: JSON 401 (headers_test
	// checks a plain GET without a key too).
	for _, query := range []string{"", "?publicKey=", "?publicKey=pk_live_unknown", "?publicKey=" + p.SecretKey} {
		res, body, _ := exchange(head(query)+"\r\n", false)
		if res.StatusCode != 401 || strings.TrimSpace(body) != `{"error":"unauthorized"}` {
			t.Fatalf("plain GET /ws%s: %d %s, want the JSON 401", query, res.StatusCode, body)
		}
		ts.Handshake("/ws"+query).Expect(t, http.StatusUnauthorized, `{"error":"unauthorized"}`)
	}
	// The plain GETs opened no connection; a real handshake still opens.
	if n := ts.Metrics(t).Get(t, "relay_connections_opened_total", ""); n != 0 {
		t.Fatalf("%v connections opened", n)
	}
	if r := ts.Handshake("/ws?publicKey=" + p.PublicKey); r.Status != http.StatusSwitchingProtocols {
		t.Fatalf("handshake: %d %s", r.Status, r.Raw)
	}
}
