package main

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/memstore"
)

// loadSnapshot reads the memory store's snapshot file, if cfg names one
// and it exists, into rt's store, which is new and empty. A snapshot that
// cannot be used stops the start: its message names the file and the
// reason, and the way out.
func loadSnapshot(cfg config.Config, rt *runtime, log *slog.Logger) error {
	path := cfg.Store.Memory.Snapshot
	if cfg.Store.Type != config.StoreMemory || path == "" {
		return nil
	}
	st, ok := rt.raw.(*memstore.Store)
	if !ok {
		return fmt.Errorf("store.memory.snapshot: the store is %T, not the memory store", rt.raw)
	}
	if fi, err := os.Stat(filepath.Dir(path)); err != nil || !fi.IsDir() {
		return fmt.Errorf("store.memory.snapshot %s: its directory %s does not exist or is not a directory", path, filepath.Dir(path))
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		log.Info("no snapshot yet: every bucket starts full", "snapshot", path)
		return nil
	}
	if err != nil {
		return fmt.Errorf("store.memory.snapshot: %w", err)
	}
	defer f.Close()
	n, err := st.ReadSnapshot(f, memstore.SnapshotOptions{MaxAge: cfg.Store.Memory.SnapshotMaxAge})
	if err != nil {
		return fmt.Errorf("store.memory.snapshot %s: %w; nothing was loaded; move the file away to start with every bucket full", path, err)
	}
	log.Info("snapshot loaded", "snapshot", path, "buckets", n)
	return nil
}

// saveSnapshot writes rt's memory store to cfg's snapshot file, if it
// names one: to a temporary file in the same directory, synced, then
// renamed over the old snapshot, so that a crash leaves the old one or the
// new one, never half of either.
func saveSnapshot(cfg config.Config, rt *runtime, log *slog.Logger) error {
	path := cfg.Store.Memory.Snapshot
	if cfg.Store.Type != config.StoreMemory || path == "" {
		return nil
	}
	st, ok := rt.raw.(*memstore.Store)
	if !ok {
		return nil
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("store.memory.snapshot: %w", err)
	}
	n, err := st.WriteSnapshot(tmp)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name()) //nolint:errcheck // best effort; the error below says what failed
		return fmt.Errorf("store.memory.snapshot %s: not written: %w", path, err)
	}
	log.Info("snapshot written", "snapshot", path, "buckets", n)
	return nil
}
