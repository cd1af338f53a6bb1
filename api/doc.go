// Package api is the HTTP surface: the control plane under /api/, the emit and
// revoke endpoints, the WebSocket handshake, health checks and the operator
// listener. It decodes requests and writes error bodies; it owns no state that
// outlives a request (budgets live in the actors, rows in the store) except
// the key index, a bounded cache of the store's API keys.
package api
