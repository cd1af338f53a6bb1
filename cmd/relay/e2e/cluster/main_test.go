//go:build cluster

package cluster

import (
	"testing"

	"github.com/relayhq/relay/store/storetest"
)

// TestMain stops the throwaway PostgreSQL the tests start.
func TestMain(m *testing.M) { storetest.Main(m) }

// The cluster port's names an attacker who reached it would learn from
// its traffic: the node actor every member runs, and the channel grains' kind.
const (
	nodeActorName = "relay-node"
	channelKind   = "relay-channel"
)
