package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
)

func TestRequestIDs(t *testing.T) {
	clk := newClock()
	s := newStore(t, memstore.Options{Now: clk.Now, RequestIDTTL: time.Minute, SweepInterval: -1})
	ctx := context.Background()
	r := sluice.Request{Policy: "test", Key: "a", Cost: 4, Limit: perSecond10, RequestID: "req-1"}
	first, err := s.Take(ctx, r)
	if err != nil || !first.Allowed || first.Remaining != 6 {
		t.Fatalf("Take(%+v) = %+v, %v; want allowed, 6 remaining", r, first, err)
	}
	clk.Advance(time.Second)
	again, err := s.Take(ctx, r)
	want := first
	want.Replayed = true
	if err != nil || again != want {
		t.Fatalf("retry Take(%+v) = %+v, %v; want %+v", r, again, err, want)
	}
	if d, _ := s.Peek(ctx, sluice.Request{Policy: "test", Key: "a", Cost: 1, Limit: perSecond10}); d.Remaining != 10 {
		t.Fatalf("Peek after replay Remaining = %d, want 10 (refilled, replay consumed nothing)", d.Remaining)
	}
	conflict := r
	conflict.Cost = 5
	if _, err := s.Take(ctx, conflict); !errors.Is(err, sluice.ErrRequestIDConflict) {
		t.Fatalf("Take(same ID, other cost) error %v, want ErrRequestIDConflict", err)
	}
	// Request IDs are scoped by key (and by policy: see
	// TestRequestIDScopedByPolicy).
	other := r
	other.Key = "b"
	if d, err := s.Take(ctx, other); err != nil || d.Replayed {
		t.Fatalf("Take(same ID, other key) = %+v, %v; want a fresh decision", d, err)
	}
	// After the TTL the ID is forgotten and decides afresh.
	clk.Advance(time.Minute)
	if d, err := s.Take(ctx, r); err != nil || d.Replayed || d.Remaining != 6 {
		t.Fatalf("Take after TTL = %+v, %v; want a fresh decision with 6 remaining", d, err)
	}
	if st := s.Stats(); st.RequestIDs != 2 {
		t.Fatalf("Stats().RequestIDs = %d, want 2 (one expired and replaced, one for key b)", st.RequestIDs)
	}
}

// The request-ID memory stays within MaxRequestIDs whatever the overflow
// policy, and a full memory forgets its oldest ID rather than refusing a
// request.
func TestRequestIDMemoryBounded(t *testing.T) {
	lim := sluice.Limit{Capacity: 1000, Rate: sluice.PerSecond(1)}
	for _, overflow := range []memstore.Overflow{memstore.RefuseNew, memstore.EvictLRU} {
		t.Run(overflow.String(), func(t *testing.T) {
			s := newStore(t, memstore.Options{Now: newClock().Now, MaxRequestIDs: 16, Shards: 1, Overflow: overflow, SweepInterval: -1})
			ctx := context.Background()
			for i := range 100 {
				r := sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: lim, RequestID: fmt.Sprint(i)}
				if d, err := s.Take(ctx, r); err != nil || !d.Allowed {
					t.Fatalf("Take(%+v) = %+v, %v; want allowed", r, d, err)
				}
				if n := s.Stats().RequestIDs; n > 16 {
					t.Fatalf("Stats().RequestIDs = %d, want <= 16", n)
				}
			}
			if st := s.Stats(); st.RequestIDs != 16 || st.EvictedRequestIDs != 84 || st.Refused != 0 {
				t.Fatalf("Stats() = %+v, want 16 IDs, 84 forgotten early, 0 refused", st)
			}
			// The 16 newest are remembered, the oldest forgotten: a late
			// retry of a forgotten ID is charged again.
			for _, tt := range []struct {
				id           string
				wantReplayed bool
			}{{"99", true}, {"84", true}, {"83", false}, {"0", false}} {
				r := sluice.Request{Policy: "test", Key: "k", Cost: 1, Limit: lim, RequestID: tt.id}
				if d, err := s.Take(ctx, r); err != nil || d.Replayed != tt.wantReplayed {
					t.Fatalf("retry Take(ID %s) = %+v, %v; want Replayed %v", tt.id, d, err, tt.wantReplayed)
				}
			}
		})
	}
}

// A denial is not remembered: it consumed nothing, so a retry with the same
// ID decides afresh, and once allowed that decision is the one replayed.
func TestDeniedRequestIDNotRemembered(t *testing.T) {
	clk := newClock()
	s := newStore(t, memstore.Options{Now: clk.Now, SweepInterval: -1})
	ctx := context.Background()
	drain := sluice.Request{Policy: "test", Key: "k", Cost: 10, Limit: perSecond10}
	if d, err := s.Take(ctx, drain); err != nil || !d.Allowed {
		t.Fatalf("Take(%+v) = %+v, %v; want allowed", drain, d, err)
	}
	r := sluice.Request{Policy: "test", Key: "k", Cost: 2, Limit: perSecond10, RequestID: "retry-me"}
	denied, err := s.Take(ctx, r)
	if err != nil || denied.Allowed || denied.RetryAfter != 200*time.Millisecond {
		t.Fatalf("Take(%+v) = %+v, %v; want denied, retry after 200ms", r, denied, err)
	}
	if st := s.Stats(); st.RequestIDs != 0 {
		t.Fatalf("Stats().RequestIDs = %d after a denial, want 0", st.RequestIDs)
	}
	clk.Advance(denied.RetryAfter)
	allowed, err := s.Take(ctx, r)
	want := sluice.Decision{Allowed: true, Remaining: 0, ResetAfter: time.Second, Limit: perSecond10}
	if err != nil || allowed != want {
		t.Fatalf("retry Take(%+v) after RetryAfter = %+v, %v; want %+v", r, allowed, err, want)
	}
	clk.Advance(time.Second)
	again, err := s.Take(ctx, r)
	want.Replayed = true
	if err != nil || again != want {
		t.Fatalf("second retry Take(%+v) = %+v, %v; want %+v", r, again, err, want)
	}
}

// A client cannot use up the request-ID memory for others: neither by
// flooding denied requests with fresh IDs, nor by flooding allowed ones
// over many keys. Another client's first idempotent request is still
// decided, and its retry replayed while the flood has not pushed it out.
func TestRequestIDFloodRefusesNoOne(t *testing.T) {
	for _, overflow := range []memstore.Overflow{memstore.RefuseNew, memstore.EvictLRU} {
		t.Run(overflow.String(), func(t *testing.T) {
			s := newStore(t, memstore.Options{Now: newClock().Now, MaxRequestIDs: 1024, Shards: 1, Overflow: overflow, SweepInterval: -1})
			ctx := context.Background()
			attacker := sluice.Request{Policy: "api", Key: "attacker", Cost: 10, Limit: perSecond10}
			if _, err := s.Take(ctx, attacker); err != nil {
				t.Fatal(err)
			}
			// Over its quota: every request is denied, each with a new ID.
			for i := range 5000 {
				attacker.RequestID = fmt.Sprint("denied-", i)
				attacker.Cost = 1
				if d, err := s.Take(ctx, attacker); err != nil || d.Allowed {
					t.Fatalf("Take(%+v) = %+v, %v; want denied", attacker, d, err)
				}
			}
			if st := s.Stats(); st.RequestIDs != 0 {
				t.Fatalf("Stats().RequestIDs = %d after denials only, want 0", st.RequestIDs)
			}
			victim := sluice.Request{Policy: "api", Key: "victim", Cost: 1, Limit: perSecond10, RequestID: "order-1"}
			if d, err := s.Take(ctx, victim); err != nil || !d.Allowed {
				t.Fatalf("Take(%+v) after a flood of denials = %+v, %v; want allowed", victim, d, err)
			}
			// Allowed requests over many keys fill the memory and more.
			for i := range 5000 {
				r := sluice.Request{Policy: "api", Key: fmt.Sprint("sock-puppet-", i), Cost: 1, Limit: perSecond10, RequestID: "x"}
				if d, err := s.Take(ctx, r); err != nil || !d.Allowed {
					t.Fatalf("Take(%+v) = %+v, %v; want allowed", r, d, err)
				}
			}
			second := sluice.Request{Policy: "api", Key: "victim", Cost: 1, Limit: perSecond10, RequestID: "order-2"}
			d, err := s.Take(ctx, second)
			if err != nil || !d.Allowed {
				t.Fatalf("Take(%+v) with the ID memory full = %+v, %v; want allowed", second, d, err)
			}
			if d, err := s.Take(ctx, second); err != nil || !d.Replayed {
				t.Fatalf("retry Take(%+v) = %+v, %v; want replayed", second, d, err)
			}
			if st := s.Stats(); st.RequestIDs != 1024 || st.Refused != 0 || st.EvictedRequestIDs != 5002-1024 {
				t.Fatalf("Stats() = %+v, want 1024 IDs, 0 refused, %d forgotten early", st, 5002-1024)
			}
		})
	}
}
