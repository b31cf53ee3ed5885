package memstore

// NonBlocking reports true: a Store's calls wait only for shard locks (a
// multi-take for those of its buckets) held for bounded critical sections,
// never for I/O. A failure wrapper (package guard) then calls the store on
// the caller's goroutine, with no goroutine or timer of its own.
func (*Store) NonBlocking() bool { return true }
