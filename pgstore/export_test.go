package pgstore

// SetInsertFirst makes every eligible take of s try the insert-first path
// (on), or none of them (off), instead of choosing by its score.
func SetInsertFirst(s *Store, on bool) {
	if on {
		s.insertFirstMode = insertFirstAlways
	} else {
		s.insertFirstMode = insertFirstNever
	}
}

// Queued returns the number of takes of s waiting for a shared
// transaction.
func Queued(s *Store) int {
	if s.batcher == nil {
		return 0
	}
	s.batcher.mu.Lock()
	defer s.batcher.mu.Unlock()
	return len(s.batcher.queue)
}
