package webhooks

import (
	"testing"

	"github.com/relayhq/relay/store/storetest"
)

// TestMain stops the throwaway PostgreSQL the tests start.
func TestMain(m *testing.M) { storetest.Main(m) }
