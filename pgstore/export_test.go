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
