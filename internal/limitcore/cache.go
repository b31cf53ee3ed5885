package limitcore

import (
	"sync"
	"sync/atomic"
)

// Cache holds values built once per key and read on every request: the
// formatted names and limits of a policy's decisions. Reads take no lock:
// the map is replaced, never changed, and inserts are rare. The zero Cache
// is empty and ready to use.
type Cache[K comparable, V any] struct {
	mu sync.Mutex // serializes inserts
	m  atomic.Pointer[map[K]V]
}

// Get returns the value of k, built by build the first time. The value is
// shared by every caller: it must not be changed. The cache keeps at most
// max keys; past that a value is built for each call, so that keys a
// caller chooses cannot grow it without bound.
func (c *Cache[K, V]) Get(k K, max int, build func() V) V {
	if m := c.m.Load(); m != nil {
		if v, ok := (*m)[k]; ok {
			return v
		}
	}
	v := build()
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.m.Load()
	if old == nil {
		old = &map[K]V{}
	}
	if len(*old) >= max {
		return v
	}
	if cached, ok := (*old)[k]; ok {
		return cached
	}
	m := make(map[K]V, len(*old)+1)
	for k, v := range *old {
		m[k] = v
	}
	m[k] = v
	c.m.Store(&m)
	return v
}

// Len returns the number of keys the cache holds.
func (c *Cache[K, V]) Len() int {
	if m := c.m.Load(); m != nil {
		return len(*m)
	}
	return 0
}
