package memstore_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
)

// New refuses an option out of its range, naming the option and what it
// allows, and builds nothing.
func TestNewRefusesInvalidOptions(t *testing.T) {
	tests := []struct {
		name    string
		options memstore.Options
		want    string // in the error message
	}{
		{"negative MaxKeys", memstore.Options{MaxKeys: -1}, "MaxKeys -1"},
		{"unknown Overflow", memstore.Options{Overflow: 7}, "Overflow 7"},
		{"unknown OnLimitChange", memstore.Options{OnLimitChange: 3}, "OnLimitChange 3"},
		{"negative RequestIDTTL", memstore.Options{RequestIDTTL: -time.Second}, "RequestIDTTL -1s"},
		{"negative MaxRequestIDs", memstore.Options{MaxRequestIDs: -5}, "MaxRequestIDs -5"},
		{"fewer request IDs than shards", memstore.Options{MaxRequestIDs: 100, Shards: 128}, "MaxRequestIDs 100"},
		{"fewer request IDs than default shards", memstore.Options{MaxRequestIDs: 255}, "MaxRequestIDs 255"},
		{"negative Shards", memstore.Options{Shards: -2}, "Shards -2"},
		{"too many Shards", memstore.Options{Shards: 1<<16 + 1}, "Shards 65537"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := memstore.New(tt.options)
			if s != nil {
				s.Close()
			}
			if !errors.Is(err, sluice.ErrInvalidOption) || s != nil {
				t.Fatalf("New(%+v) returned a store: %v, error %v; want no store and an error wrapping ErrInvalidOption", tt.options, s != nil, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New(%+v) error %q, want it to name %q", tt.options, err, tt.want)
			}
		})
	}
}

// The zero value of every option means its default, and the edges of each
// range are accepted.
func TestNewAcceptsValidOptions(t *testing.T) {
	tests := []struct {
		name    string
		options memstore.Options
	}{
		{"zero", memstore.Options{}},
		{"sweeper off", memstore.Options{SweepInterval: -1}},
		{"one shard, one key, one ID", memstore.Options{Shards: 1, MaxKeys: 1, MaxRequestIDs: 1}},
		{"most shards", memstore.Options{Shards: 1 << 16, MaxRequestIDs: 1 << 16}},
		{"shards rounded up", memstore.Options{Shards: 100, MaxRequestIDs: 128}},
		{"every overflow", memstore.Options{Overflow: memstore.EvictLRU}},
		{"every conversion", memstore.Options{OnLimitChange: sluice.ResetTokens}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := memstore.New(tt.options)
			if err != nil {
				t.Fatalf("New(%+v) error %v, want nil", tt.options, err)
			}
			s.Close()
		})
	}
}
