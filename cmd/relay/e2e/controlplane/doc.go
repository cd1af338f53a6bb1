// Package controlplane holds the end-to-end tests of the control-plane API
// (/api/auth, /api/projects and their keys and settings) and of the HTTP
// edges every route shares (headers, methods, bodies, the operator token),
// on both stores, against the relay binary on loopback, with the shared
// harness cmd/relay/internal/relaytest.
package controlplane
