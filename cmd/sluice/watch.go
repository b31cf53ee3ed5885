package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
)

// reloadDebounce is how long the config's directory must be quiet after a
// change before the file is read again: an editor's save or a ConfigMap's
// symlink swap is a burst of events, and a file being written is read only
// once the writer is done with it.
var reloadDebounce = 100 * time.Millisecond

// watchConfig watches the directory of the config file at path and calls
// reload after each burst of changes in it, until ctx ends. The directory,
// not the file, is watched: an editor that saves by renaming a new file over
// the old one, and Kubernetes, which mounts a ConfigMap as symlinks and
// updates it by swapping the "..data" symlink, replace the file without
// writing to it. Every change in the directory triggers a read; reload
// compares the file's hash with the config in use, so a change elsewhere in
// the directory replaces nothing.
//
// The directories of extra paths are watched too (the Envoy rules: a
// directory is watched itself, a file through its directory).
//
// It returns once the watch is set up, or an error if it cannot be; the
// watch then runs on its own goroutine, and done is closed when it stops.
func watchConfig(ctx context.Context, path string, log *slog.Logger, reload func(), extra ...string) (done <-chan struct{}, err error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watching the config file: %w", err)
	}
	dirs := []string{filepath.Dir(path)}
	for _, p := range extra {
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			dirs = append(dirs, p)
		} else {
			dirs = append(dirs, filepath.Dir(p))
		}
	}
	for _, dir := range dirs {
		if err := w.Add(dir); err != nil {
			w.Close()
			return nil, fmt.Errorf("watching the directory %s: %w", dir, err)
		}
	}
	dir := strings.Join(dirs, ", ")
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		defer w.Close()
		timer := time.NewTimer(time.Hour)
		timer.Stop()
		defer timer.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if ev.Op == fsnotify.Chmod {
					continue // a touch or chmod changes no content
				}
				timer.Reset(reloadDebounce)
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				// An overflow of the kernel's queue loses events: read the
				// file anyway, in case one of them was the change.
				log.Warn("watching the config file", "dir", dir, "error", err)
				timer.Reset(reloadDebounce)
			case <-timer.C:
				reload()
			}
		}
	}()
	return ch, nil
}
