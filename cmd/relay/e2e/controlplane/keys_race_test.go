package controlplane

import (
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayhq/relay/cmd/relay/internal/relaytest"
	"github.com/relayhq/relay/store/storetest"
)

// TestRevokeRacingHandshakes: a rotation without overlap revokes the old
// public key at once, with no grace period: once the rotation has answered,
// no socket opened with the old key stays open. A handshake that checked the
// key just before the revocation but registered its socket with the project
// after the revocation's close used to stay open on the dead key (until its
// lifetime cap); the key is now looked up again once the socket is
// registered.
func TestRevokeRacingHandshakes(t *testing.T) {
	t.Parallel()
	storetest.EachDB(t, func(t *testing.T, dbURL string) {
		ts := relaytest.Start(t, dbURL, nil)
		alice, aliceID := ts.SignupID(t, "alice@example.com")
		survivors := 0
		for round := 0; round < 8 && survivors == 0; round++ {
			p, _ := relaytest.CreateChecked(alice, t, "Race", aliceID)
			keep := ts.DialWS(p.PublicKey) // the project actor runs
			var (
				mu     sync.Mutex
				opened []*relaytest.WS
				stop   atomic.Bool
				wg     sync.WaitGroup
			)
			for g := 0; g < 16; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for !stop.Load() {
						c, status, err := ts.TryDialWS(p.PublicKey)
						if err != nil {
							if status == http.StatusUnauthorized {
								return
							}
							continue
						}
						mu.Lock()
						opened = append(opened, c)
						mu.Unlock()
					}
				}()
			}
			// The handshakes race the rotation: under way, sockets opening.
			relaytest.Eventually(t, 10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(opened) >= 16 },
				"round %d: 16 sockets opened before the rotation", round)
			r := alice.Do("POST", "/api/projects/"+p.ID+"/keys", `{"keyType":"public"}`)
			if r.Status != http.StatusCreated {
				t.Fatalf("rotate: %d %s", r.Status, r.Raw)
			}
			stop.Store(true)
			wg.Wait()
			keep.ExpectClose(4001, 5*time.Second)
			// Each socket has until 0.5 s after that close to be closed; one
			// closed sooner is done with sooner.
			deadline := time.Now().Add(500 * time.Millisecond)
			mu.Lock()
			for _, c := range opened {
				closed := false
			drain:
				for {
					f, ok := c.Next(max(time.Until(deadline), 10*time.Millisecond))
					switch {
					case !ok:
						break drain
					case f.Closed || f.Err != nil:
						closed = true
						break drain
					}
				}
				if !closed {
					// Still served: a ping gets its pong.
					c.Send(`{"action":"ping"}`)
					if f, ok := c.Next(2 * time.Second); ok && f.Text != "" {
						t.Logf("socket opened with the revoked key answers: %s", f.Text)
						survivors++
					}
				}
			}
			t.Logf("round %d: %d sockets opened with the old key, %d still open 0.5 s after the rotation", round, len(opened), survivors)
			mu.Unlock()
		}
		if survivors > 0 {
			t.Fatalf("%d sockets opened with a revoked public key stayed open after the revocation answered", survivors)
		}
	})
}
