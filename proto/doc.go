// Package proto holds what crosses a boundary: the error codes, limits and JSON
// frame shapes of PROTOCOL.md (beside this file), and the channel-name rule. It imports no package of ours,
// so the server, the Go client and the load tool can all share it.
package proto
