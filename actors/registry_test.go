package actors

import "testing"

// TestRegistryOneShardPerBucket: the process registry's maps are one per
// bucket (registry.go), made after the setting took effect.
func TestRegistryOneShardPerBucket(t *testing.T) {
	sys := newTestSystem(t, Config{})
	buckets := sys.as.ProcessRegistry.LocalPIDs.LocalPIDs
	if len(buckets) == 0 || len(buckets[0]) != 1 {
		t.Fatalf("%d buckets of %d shards, want shards of 1", len(buckets), len(buckets[0]))
	}
}
