package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// The naive hub is the comparison point for HTTP emit: the server most
// people write first (net/http, gorilla/websocket, a goroutine and a channel
// per subscriber, one mutex over a map of channels), answering the same
// POST /emit body and Authorization header as the relay. It has no budgets,
// presence, replay or persistence: whatever the relay spends on those shows
// as the difference. `relay-bench suite` starts it as a child process
// (`relay-bench naive`) so that its CPU is read apart from the tool's.

// naiveSecretKey is the one key the naive hub accepts.
const naiveSecretKey = "naive-secret"

func runNaive(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("naive", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:0", "loopback address to listen on")
	fs.Parse(args)
	host, _, err := net.SplitHostPort(*addr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("-addr: want a loopback host:port, got %q", *addr)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: newNaiveHub(), ReadHeaderTimeout: 5 * time.Second}
	// The same ready line as the relay's, so one process starter serves both.
	slog.New(slog.NewTextHandler(os.Stderr, nil)).Info("listening", "listener", "public", "addr", ln.Addr().String())
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

type naiveHub struct {
	mu       sync.Mutex
	channels map[string]map[*naiveSub]struct{}
	seq      map[string]uint64
}

type naiveSub struct {
	out chan []byte
}

func newNaiveHub() http.Handler {
	h := &naiveHub{channels: map[string]map[*naiveSub]struct{}{}, seq: map[string]uint64{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /emit", h.emit)
	mux.HandleFunc("GET /ws", h.subscribe)
	return mux
}

var naiveUpgrader = websocket.Upgrader{CheckOrigin: func(*http.Request) bool { return true }}

// subscribe is GET /ws?channel=name: every message of that channel, as the
// relay frames it ({"channel","payload","seq"}).
func (h *naiveHub) subscribe(w http.ResponseWriter, r *http.Request) {
	channel := r.URL.Query().Get("channel")
	if channel == "" {
		http.Error(w, "channel required", http.StatusBadRequest)
		return
	}
	c, err := naiveUpgrader.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	sub := &naiveSub{out: make(chan []byte, 256)}
	h.mu.Lock()
	if h.channels[channel] == nil {
		h.channels[channel] = map[*naiveSub]struct{}{}
	}
	h.channels[channel][sub] = struct{}{}
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.channels[channel], sub)
		h.mu.Unlock()
		c.Close()
	}()
	gone := make(chan struct{})
	go func() { // the reader: only to notice the close
		defer close(gone)
		for {
			if _, _, err := c.ReadMessage(); err != nil {
				return
			}
		}
	}()
	for {
		select {
		case msg := <-sub.out:
			if err := c.WriteMessage(websocket.TextMessage, msg); err != nil {
				return
			}
		case <-gone:
			return
		}
	}
}

func (h *naiveHub) emit(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+naiveSecretKey {
		http.Error(w, `{"error":"invalid_secret_key"}`, http.StatusUnauthorized)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	var req struct {
		Channel string          `json:"channel"`
		Payload json.RawMessage `json:"payload"`
	}
	if err != nil || json.Unmarshal(body, &req) != nil || req.Channel == "" {
		http.Error(w, `{"error":"invalid_json"}`, http.StatusBadRequest)
		return
	}
	h.mu.Lock()
	h.seq[req.Channel]++
	seq := h.seq[req.Channel]
	msg, _ := json.Marshal(map[string]any{"channel": req.Channel, "payload": req.Payload, "seq": seq})
	delivered, subscribers := 0, len(h.channels[req.Channel])
	for sub := range h.channels[req.Channel] {
		select {
		case sub.out <- msg:
			delivered++
		default: // a slow subscriber misses it
		}
	}
	h.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	name, _ := json.Marshal(req.Channel)
	fmt.Fprintf(w, `{"ok":true,"channel":%s,"seq":%d,"delivered":%d,"subscriberCount":%d}`+"\n",
		name, seq, delivered, subscribers)
}
