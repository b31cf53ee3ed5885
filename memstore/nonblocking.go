package memstore

// NonBlocking reports true: a Store's Take and Peek wait only for a shard
// lock held for a bounded critical section, never for I/O. A failure
// wrapper (package guard) then calls the store on the caller's goroutine,
// with no goroutine or timer of its own.
func (*Store) NonBlocking() bool { return true }
