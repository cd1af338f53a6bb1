// Package load holds the relay's load tests, black-box against the real
// binary on loopback, each bounded in count and time: the soak (go test
// -tags soak, `make soak`) and the worst-case memory checks (-tags
// worstcase, `make worstcase`; `make test` runs both in a short form).
// They reach the relay only through its HTTP, WebSocket and operator
// listeners, with the shared harness cmd/relay/internal/relaytest.
package load
