//go:build soak || worstcase

package load

import (
	"testing"

	"github.com/relayhq/relay/store/storetest"
)

// TestMain stops the throwaway PostgreSQL the soak starts.
func TestMain(m *testing.M) { storetest.Main(m) }
