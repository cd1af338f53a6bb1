// Package wire holds the end-to-end tests of the WebSocket protocol: what a
// client sends and is answered, replay with since, channel authorization
// with connection tokens (the project's secret or its JWKS), and abusive
// peers, on both stores, against the relay binary on loopback, with the
// shared harness cmd/relay/internal/relaytest.
package wire
