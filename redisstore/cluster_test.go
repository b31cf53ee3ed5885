package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestClusterSlotMigration moves the slots of a dozen buckets from one
// master of the private cluster to another, key by key, while 8 goroutines
// take from those buckets (every fifth take with a request ID, so that a
// bucket and its record may sit on two nodes for a moment). go-redis
// follows the ASK and MOVED redirects, the store resends what Redis
// refuses with TRYAGAIN, and no decision fails. Each bucket, drained on its
// new owner afterwards, has allowed exactly its capacity: the move neither
// loses a charge nor mints a token.
func TestClusterSlotMigration(t *testing.T) {
	if testing.Short() {
		t.Skip("the cluster is skipped with -short")
	}
	ctx := t.Context()
	c := redis.NewClusterClient(redistest.ClusterOptions(t))
	t.Cleanup(func() { c.Close() })
	// Count the redirects and refusals the nodes answer, which go-redis
	// and the store handle, so that the test shows it met them.
	var redirects redirectCount
	c.OnNewNode(func(n *redis.Client) { n.AddHook(&redirects) })
	for _, batch := range batchModes {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			s := newStore(t, c, Options{Batch: batch})
			ask0, moved0, try0 := redirects.ask.Load(), redirects.moved.Load(), redirects.tryAgain.Load()
			l := sluice.Limit{Capacity: 50, Rate: sluice.Per(1, time.Hour)}
			const nKeys, workers = 12, 8

			keys := make([]string, nKeys)
			slots := map[int64]bool{}
			for i := range keys {
				keys[i] = fmt.Sprint("user-", i)
				slot, err := c.ClusterKeySlot(ctx, s.bucketKey(testPolicy, keys[i])).Result()
				if err != nil {
					t.Fatal(err)
				}
				slots[slot] = true
			}

			var (
				allowed  [nKeys]atomic.Int64
				decided  atomic.Int64
				failed   atomic.Int64
				firstErr atomic.Pointer[error]
				moving   = make(chan struct{})
				wg       sync.WaitGroup
			)
			take := func(w, i int) {
				k := (w + i) % nKeys
				r := sluice.Request{Policy: testPolicy, Key: keys[k], Cost: 1, Limit: l}
				if i%5 == 0 {
					r.RequestID = fmt.Sprint("req-", w, "-", i)
				}
				d, err := s.Take(ctx, r)
				decided.Add(1)
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, &err)
					return
				}
				if d.Allowed {
					allowed[k].Add(1)
				}
			}
			for w := range workers {
				wg.Go(func() {
					for i := 0; ; i++ {
						select {
						case <-moving:
							return
						default:
						}
						take(w, i)
					}
				})
			}
			moved, err := moveSlots(ctx, c, slices.Sorted(func(yield func(int64) bool) {
				for s := range slots {
					if !yield(s) {
						return
					}
				}
			}))
			close(moving)
			wg.Wait()
			if err != nil {
				t.Fatal(err)
			}
			if n := failed.Load(); n > 0 {
				t.Fatalf("%d of %d decisions failed while %d slots moved; first: %v", n, decided.Load(), moved, *firstErr.Load())
			}
			// Take what is left, on the slots' new owners, so that every
			// bucket is drained.
			for k := range keys {
				for range l.Capacity + 1 {
					d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: keys[k], Cost: 1, Limit: l})
					if err != nil {
						t.Fatalf("Take(%q) after the move: %v", keys[k], err)
					}
					if !d.Allowed {
						break
					}
					allowed[k].Add(1)
				}
				if got := allowed[k].Load(); got != l.Capacity {
					t.Errorf("bucket %q allowed %d takes, want exactly its capacity %d", keys[k], got, l.Capacity)
				}
			}
			ask, movedErrs, tryAgain := redirects.ask.Load()-ask0, redirects.moved.Load()-moved0, redirects.tryAgain.Load()-try0
			t.Logf("%d decisions, 0 failed, while %d slots moved; nodes answered %d ASK, %d MOVED, %d TRYAGAIN",
				decided.Load(), moved, ask, movedErrs, tryAgain)
			if ask+movedErrs == 0 {
				t.Error("no node answered ASK or MOVED: the decisions did not meet the move")
			}
		})
	}
}

// moveSlots moves each slot to the next master after its owner, as
// redis-cli --cluster reshard does (keys in batches of 10), with pauses so
// that decisions meet each state of the move: the target importing, the
// source migrating, the keys moving, and the slot handed over, to the
// target first. It returns the number of slots moved.
func moveSlots(ctx context.Context, c *redis.ClusterClient, slots []int64) (int, error) {
	shards, err := c.ClusterShards(ctx).Result()
	if err != nil {
		return 0, err
	}
	type node struct {
		id   string
		addr string
		c    *redis.Client
		from []redis.SlotRange // the slots it serves
	}
	var masters []*node
	for _, sh := range shards {
		for _, n := range sh.Nodes {
			if n.Role != "master" {
				continue
			}
			addr := net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
			m := &node{id: n.ID, addr: addr, c: redis.NewClient(&redis.Options{Addr: addr}), from: sh.Slots}
			defer m.c.Close()
			masters = append(masters, m)
		}
	}
	owner := func(slot int64) *node {
		for _, m := range masters {
			for _, r := range m.from {
				if r.Start <= slot && slot <= r.End {
					return m
				}
			}
		}
		return nil
	}
	if len(masters) < 2 {
		return 0, fmt.Errorf("the cluster has %d masters; moving a slot needs two", len(masters))
	}
	pause := func() { time.Sleep(20 * time.Millisecond) }
	for _, slot := range slots {
		src := owner(slot)
		if src == nil {
			return 0, fmt.Errorf("no master owns slot %d", slot)
		}
		dst := masters[(slices.Index(masters, src)+1)%len(masters)]
		host, port, err := net.SplitHostPort(dst.addr)
		if err != nil {
			return 0, err
		}
		if err := dst.c.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", src.id).Err(); err != nil {
			return 0, fmt.Errorf("slot %d: IMPORTING on the target: %w", slot, err)
		}
		if err := src.c.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst.id).Err(); err != nil {
			return 0, fmt.Errorf("slot %d: MIGRATING on the source: %w", slot, err)
		}
		pause()
		for {
			keys, err := src.c.ClusterGetKeysInSlot(ctx, int(slot), 10).Result()
			if err != nil {
				return 0, fmt.Errorf("slot %d: GETKEYSINSLOT: %w", slot, err)
			}
			if len(keys) == 0 {
				break
			}
			args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
			for _, k := range keys {
				args = append(args, k)
			}
			if err := src.c.Do(ctx, args...).Err(); err != nil && !errors.Is(err, redis.Nil) {
				return 0, fmt.Errorf("slot %d: MIGRATE %q: %w", slot, keys, err)
			}
			time.Sleep(2 * time.Millisecond)
		}
		// The target first, so that the source's MOVED never points at a
		// node that would send the client back.
		for _, n := range append([]*node{dst, src}, masters...) {
			if err := n.c.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dst.id).Err(); err != nil {
				return 0, fmt.Errorf("slot %d: NODE on %s: %w", slot, n.addr, err)
			}
		}
		pause()
	}
	return len(slots), nil
}

// redirectCount is a go-redis hook that counts the ASK, MOVED and TRYAGAIN
// errors of a node's commands, pipelined or not.
type redirectCount struct{ ask, moved, tryAgain atomic.Int64 }

func (h *redirectCount) count(err error) {
	switch {
	case redis.HasErrorPrefix(err, "ASK"):
		h.ask.Add(1)
	case redis.HasErrorPrefix(err, "MOVED"):
		h.moved.Add(1)
	case redis.HasErrorPrefix(err, "TRYAGAIN"):
		h.tryAgain.Add(1)
	}
}

func (h *redirectCount) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *redirectCount) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.count(cmd.Err())
		return err
	}
}

func (h *redirectCount) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			h.count(cmd.Err())
		}
		return err
	}
}
