package memstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
)

func TestLimitChangeLowersCapacity(t *testing.T) {
	clk := newClock()
	for _, policy := range []sluice.Conversion{sluice.KeepTokens, sluice.ScaleTokens, sluice.ResetTokens} {
		t.Run(policy.String(), func(t *testing.T) {
			s := newStore(t, memstore.Options{Now: clk.Now, OnLimitChange: policy, SweepInterval: -1})
			ctx := context.Background()
			big := sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(1)}
			small := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
			if _, err := s.Take(ctx, sluice.Request{Policy: "test", Key: "k", Cost: 50, Limit: big}); err != nil {
				t.Fatal(err)
			}
			d, err := s.Take(ctx, sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: small})
			want := map[sluice.Conversion]int64{sluice.KeepTokens: 9, sluice.ScaleTokens: 4, sluice.ResetTokens: 9}[policy]
			if err != nil || !d.Allowed || d.Remaining != want || d.Limit != small {
				t.Fatalf("Take under lowered limit = %+v, %v; want allowed, %d remaining, limit %v", d, err, want, small)
			}
		})
	}
}

func TestCanceledContext(t *testing.T) {
	s := newStore(t, memstore.Options{SweepInterval: -1})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Take(ctx, sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: perSecond10}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Take(canceled ctx) error %v, want context.Canceled", err)
	}
	if st := s.Stats(); st.Buckets != 0 {
		t.Fatalf("Stats().Buckets = %d after a canceled Take, want 0", st.Buckets)
	}
}

// Stats.Conversions counts the takes that found their bucket stored under
// another limit: processes or configs that disagree on a policy's limit
// show up there. Peeks and replays convert nothing.
func TestConversionsCounted(t *testing.T) {
	s := newStore(t, memstore.Options{Now: newClock().Now, SweepInterval: -1})
	ctx := context.Background()
	small := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
	big := sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(1)}
	steps := []struct {
		name string
		do   func() error
		want uint64
	}{
		{"first take creates", func() error {
			_, err := s.Take(ctx, sluice.Request{Policy: "api", Key: "k", Cost: 1, Limit: small})
			return err
		}, 0},
		{"same limit", func() error {
			_, err := s.Take(ctx, sluice.Request{Policy: "api", Key: "k", Cost: 1, Limit: small})
			return err
		}, 0},
		{"peek under another limit", func() error {
			_, err := s.Peek(ctx, sluice.Request{Policy: "api", Key: "k", Cost: 1, Limit: big})
			return err
		}, 0},
		{"take under another limit", func() error {
			_, err := s.Take(ctx, sluice.Request{Policy: "api", Key: "k", Cost: 1, Limit: big, RequestID: "r"})
			return err
		}, 1},
		{"replay", func() error {
			_, err := s.Take(ctx, sluice.Request{Policy: "api", Key: "k", Cost: 1, Limit: big, RequestID: "r"})
			return err
		}, 1},
		{"other policy, other limit", func() error {
			_, err := s.Take(ctx, sluice.Request{Policy: "web", Key: "k", Cost: 1, Limit: small})
			return err
		}, 1},
		{"back to the first limit", func() error {
			_, err := s.Take(ctx, sluice.Request{Policy: "api", Key: "k", Cost: 1, Limit: small})
			return err
		}, 2},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			t.Fatalf("%s: error %v", st.name, err)
		}
		if got := s.Stats().Conversions; got != st.want {
			t.Fatalf("after %s: Stats().Conversions = %d, want %d", st.name, got, st.want)
		}
	}
}

// Peek answers for a take of r.Cost, creates nothing and takes no request
// ID.
func TestPeek(t *testing.T) {
	clk := newClock()
	s := newStore(t, memstore.Options{Now: clk.Now, SweepInterval: -1})
	ctx := context.Background()
	mustTake(t, s, "k", 7) // 3 left
	tests := []struct {
		name    string
		r       sluice.Request
		want    sluice.Decision
		wantErr error
	}{
		{"cost covered", sluice.Request{Policy: "test", Key: "k", Cost: 3, Limit: perSecond10},
			sluice.Decision{Allowed: true, Remaining: 3, ResetAfter: 700 * time.Millisecond, Limit: perSecond10}, nil},
		{"cost not covered", sluice.Request{Policy: "test", Key: "k", Cost: 5, Limit: perSecond10},
			sluice.Decision{Remaining: 3, RetryAfter: 200 * time.Millisecond, ResetAfter: 700 * time.Millisecond, Limit: perSecond10}, nil},
		{"missing bucket", sluice.Request{Policy: "test", Key: "other", Cost: 10, Limit: perSecond10},
			sluice.Decision{Allowed: true, Remaining: 10, Limit: perSecond10}, nil},
		{"other policy", sluice.Request{Policy: "other", Key: "k", Cost: 10, Limit: perSecond10},
			sluice.Decision{Allowed: true, Remaining: 10, Limit: perSecond10}, nil},
		{"request ID", sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: perSecond10, RequestID: "r"},
			sluice.Decision{}, sluice.ErrInvalidRequestID},
		{"cost above capacity", sluice.Request{Policy: "test", Key: "k", Cost: 11, Limit: perSecond10},
			sluice.Decision{}, sluice.ErrInvalidCost},
		{"no policy", sluice.Request{Key: "k", Cost: 1, Limit: perSecond10},
			sluice.Decision{}, sluice.ErrInvalidPolicy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := s.Peek(ctx, tt.r)
			if !errors.Is(err, tt.wantErr) || got != tt.want {
				t.Fatalf("Peek(%+v) = %+v, %v; want %+v, %v", tt.r, got, err, tt.want, tt.wantErr)
			}
		})
	}
	if st := s.Stats(); st.Buckets != 1 || st.RequestIDs != 0 {
		t.Fatalf("Stats() = %+v after peeks, want 1 bucket, 0 request IDs", st)
	}
}
