package redisstore

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestFailover: in the middle of a run of takes on one bucket the replica
// is promoted while the old master still serves for 50 ms (the writes of
// those 50 ms never reach the new master, as with a replica that lagged),
// then the master dies and the client's dialer follows to the new one. The
// store goes on there (it sends the script again: a replica has no script
// cache of the master's), every decision started a second after the switch
// succeeds, and over the whole run the bucket allows at least its
// capacity, less the decisions that failed without an answer (they may
// have been charged), and at most one extra full bucket: the lost writes
// can only hand out again tokens the old master had handed out.
func TestFailover(t *testing.T) {
	ctx := t.Context()
	master := redistest.Private(t)
	replica := master.Replica(t)
	var primary atomic.Pointer[string]
	addr := master.Addr()
	primary.Store(&addr)
	c := redis.NewClient(&redis.Options{
		Addr:                  master.Addr(),
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, *primary.Load())
		},
	})
	t.Cleanup(func() { c.Close() })
	s, err := New(c, Options{})
	if err != nil {
		t.Fatal(err)
	}
	l := sluice.Limit{Capacity: 1000, Rate: sluice.Per(1, time.Hour)}
	const workers = 8

	var (
		allowed, failed, lateFailed atomic.Int64
		switched                    atomic.Pointer[time.Time]
		lateErr                     atomic.Pointer[error]
		wg                          sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			for {
				start := time.Now()
				d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: l})
				sw := switched.Load()
				switch {
				case err != nil:
					failed.Add(1)
					if sw != nil && start.After(sw.Add(time.Second)) {
						lateFailed.Add(1)
						lateErr.CompareAndSwap(nil, &err)
					}
					time.Sleep(time.Millisecond)
				case d.Allowed:
					allowed.Add(1)
				case sw != nil:
					return // drained on the new master
				}
			}
		})
	}
	for allowed.Load() < l.Capacity/2 {
		time.Sleep(time.Millisecond)
	}
	// The failover: the replica becomes a master, the old one serves on
	// for a while, then new connections go to the new master and the old
	// one dies.
	promote := redis.NewClient(&redis.Options{Addr: replica.Addr()})
	defer promote.Close()
	if err := promote.ReplicaOf(ctx, "NO", "ONE").Err(); err != nil {
		t.Fatalf("REPLICAOF NO ONE: %v", err)
	}
	time.Sleep(50 * time.Millisecond)
	newAddr := replica.Addr()
	primary.Store(&newAddr)
	master.Kill()
	now := time.Now()
	switched.Store(&now)
	wg.Wait()

	if n := lateFailed.Load(); n > 0 {
		t.Errorf("%d decisions started a second after the switch failed; first: %v", n, *lateErr.Load())
	}
	got, lost := allowed.Load(), failed.Load()
	if got+lost < l.Capacity || got > 2*l.Capacity {
		t.Errorf("allowed %d (and %d failed) over the failover; want at least %d less the failures and at most %d (one extra full bucket)",
			got, lost, l.Capacity, 2*l.Capacity)
	}
	if loads := s.Stats().ScriptLoads; loads < 2 {
		t.Errorf("Stats().ScriptLoads = %d; want the script sent to both masters", loads)
	}
	t.Logf("allowed %d of a capacity of %d (%d handed out again after lost writes), %d failed during the switch", got, l.Capacity, max(0, got-l.Capacity), lost)
}
