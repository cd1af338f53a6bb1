// Package relaytest is the one harness of the relay's tests: what a test
// does to a running relay from outside. A relay to test is the real binary
// (Start, with the tests' defaults, under -race built with the race detector;
// StartBinary, as an operator starts it; Command for its other commands) or
// a server a test started in its own process, behind the same Server. Then:
// HTTP clients with their own cookie jars (Client, Response), WebSocket
// clients on an independent library (WS, Frame, ClientFrame), the dashboard
// (Dash, Page) and a headless Chromium (Browser, Tab), a loopback proxy that
// cuts, holds and freezes connections (Proxy), the Go client's helpers
// (StepClock, NextEvent), webhook endpoints (HookLog, Receiver, CheckEvent)
// and their setting through the API (Client.SetWebhook), a JWKS endpoint,
// control-plane shape checks, polling with a deadline (Eventually), a parsed
// /metrics scrape, a test clock for the in-process server (Clock), and for
// the cluster tests a throwaway etcd (StartEtcd) and free loopback addresses
// (FreeAddr). It reaches the relay only through its listeners, its commands
// and its log lines; it imports no package of the server (actors/clustertls,
// a certificate library with no server state, makes etcd's certificates).
package relaytest
