package actors

import cmap "github.com/orcaman/concurrent-map"

// protoactor's process registry, which holds every actor (one per socket),
// is 1 024 buckets of concurrent-map, each split into SHARD_COUNT (32) shards
// with a Go map of its own: 32 768 maps, 3 MB before the first actor, and
// nearly every actor alone in its map, where one entry costs a whole map
// group. One shard per bucket keeps 1 024 locks and lets each map hold its
// share of the actors. The library reads SHARD_COUNT on every access, so it
// is set here, before any actor system (or cluster PID cache) makes a map.
func init() { cmap.SHARD_COUNT = 1 }
