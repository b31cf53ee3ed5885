package memstore

// ShardOf returns the index of the shard that holds the bucket of (policy,
// key) in s.
func ShardOf(s *Store, policy, key string) int {
	_, h := s.identify(policy, key)
	return int(h & s.mask)
}

// CountBuckets returns the number of buckets in the tables of s, counted
// shard by shard under each shard's lock: with no call in flight, it is
// what Stats().Buckets must say.
func CountBuckets(s *Store) int64 {
	var n int64
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += int64(len(sh.table.entries))
		sh.mu.Unlock()
	}
	return n
}
