package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/sluicetest"
	"pgregory.net/rapid"
)

// keysOfSlots returns n keys of distinct Cluster slots, in ascending slot
// order.
func keysOfSlots(n int) []string {
	var keys []string
	seen := map[int]bool{}
	for i := 0; len(keys) < n; i++ {
		k := fmt.Sprint("user-", i)
		if !seen[clusterSlot(k)] {
			seen[clusterSlot(k)] = true
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b string) int { return clusterSlot(a) - clusterSlot(b) })
	return keys
}

// sentinelOf returns the sluice sentinel err wraps, nil if none.
func sentinelOf(err error) error {
	for _, s := range []error{
		sluice.ErrInvalidPolicy, sluice.ErrInvalidKey, sluice.ErrInvalidCost, sluice.ErrInvalidLimit,
		sluice.ErrInvalidRequestID, sluice.ErrRequestIDConflict, sluice.ErrUnknownRequestID, sluice.ErrInvalidMulti,
		sluice.ErrMisconfigured, sluice.ErrUnavailable,
	} {
		if errors.Is(err, s) {
			return s
		}
	}
	return nil
}

// TestOpsMatchModel drives the store and sluicetest.Model with the same
// random mix of every operation (takes with and without request IDs,
// peeks, multi-takes of up to four buckets, drains beyond the capacity,
// refunds with and without request IDs, resets) on keys in four different
// Cluster slots under two policies, with limits that change and a clock
// that moves both ways: every decision and every error must be the
// model's. On the cluster most multi-takes span slots, so this holds the
// take-then-refund path to the model as well as the one-script path.
func TestOpsMatchModel(t *testing.T) {
	keys := keysOfSlots(4)
	policies := []string{"burst", "daily"}
	limits := []sluice.Limit{
		{Capacity: 5, Rate: sluice.Per(1, 3*time.Millisecond)},
		{Capacity: 3, Rate: sluice.Per(2, time.Millisecond)},
		{Capacity: 7, Rate: sluice.Per(3, 7*time.Millisecond)},
		{Capacity: 4, Rate: sluice.Per(0, time.Second)},
	}
	ids := []string{"r0", "r1", "r2"}
	for name, c := range topologies(t) {
		for _, batch := range batchModes {
			t.Run(fmt.Sprintf("%s/batch=%d", name, batch), func(t *testing.T) {
				prefix := newPrefix(t, c)
				run := 0
				var crossSlot uint64
				defer func() {
					if name == "cluster" && crossSlot == 0 {
						t.Error("no multi-take spanned Cluster slots")
					}
				}()
				rapid.Check(t, func(rt *rapid.T) {
					run++
					conv := rapid.SampledFrom([]sluice.Conversion{sluice.KeepTokens, sluice.ScaleTokens, sluice.ResetTokens}).Draw(rt, "conversion")
					idTTL := time.Duration(rapid.Int64Range(1, 20).Draw(rt, "request-ID TTL ms")) * time.Millisecond
					now := int64(1_000_000_000_000)
					s, err := New(c, Options{
						Prefix: fmt.Sprintf("%s%d:", prefix, run), OnLimitChange: conv, RequestIDTTL: idTTL,
						Now: func() time.Time { return micros(now) }, MinTTL: time.Hour, Batch: batch,
					})
					if err != nil {
						rt.Fatal(err)
					}
					m := sluicetest.NewModel(time.Microsecond, conv, idTTL)
					defer func() { crossSlot += s.Stats().CrossSlotTakes }()
					ctx := context.Background()
					pick := func(label string) (string, string, sluice.Limit) {
						return rapid.SampledFrom(policies).Draw(rt, label+" policy"), rapid.SampledFrom(keys).Draw(rt, label+" key"),
							rapid.SampledFrom(limits).Draw(rt, label+" limit")
					}
					compare := func(call string, got any, err error, want any, wantErr error) {
						rt.Helper()
						if sentinelOf(err) != sentinelOf(wantErr) || (err == nil) != (wantErr == nil) {
							rt.Fatalf("%s = %+v, %v; want %+v, %v (the model's)", call, got, err, want, wantErr)
						}
						if err == nil {
							if diff := cmp.Diff(want, got); diff != "" {
								rt.Fatalf("%s = %+v, want %+v (the model's) (-want +got):\n%s", call, got, want, diff)
							}
						}
					}
					steps := rapid.IntRange(1, 40).Draw(rt, "steps")
					for range steps {
						switch op := rapid.IntRange(0, 7).Draw(rt, "operation"); op {
						case 0: // the clock moves, both ways
							now += rapid.Int64Range(-5_000, 20_000).Draw(rt, "clock step µs")
						case 1, 2:
							p, k, l := pick("take")
							r := sluice.Request{Policy: p, Key: k, Cost: rapid.Int64Range(1, l.Capacity).Draw(rt, "cost"), Limit: l}
							if op == 2 {
								r.RequestID = rapid.SampledFrom(ids).Draw(rt, "request ID")
							}
							got, err := s.Take(ctx, r)
							want, wantErr := m.Take(now, r)
							compare(fmt.Sprintf("Take(%+v) at %d", r, now), got, err, want, wantErr)
						case 3:
							n := rapid.IntRange(1, 4).Draw(rt, "parts")
							var rs []sluice.Request
							for range n {
								p, k, l := pick("part")
								if slices.ContainsFunc(rs, func(r sluice.Request) bool { return r.Policy == p && r.Key == k }) {
									continue
								}
								rs = append(rs, sluice.Request{Policy: p, Key: k, Cost: rapid.Int64Range(1, l.Capacity).Draw(rt, "part cost"), Limit: l})
							}
							got, err := s.TakeAll(ctx, rs)
							want, wantErr := m.TakeAll(now, rs)
							compare(fmt.Sprintf("TakeAll(%+v) at %d", rs, now), got, err, want, wantErr)
						case 4:
							p, k, l := pick("drain")
							r := sluice.Request{Policy: p, Key: k, Cost: rapid.Int64Range(1, 2*l.Capacity).Draw(rt, "drain cost"), Limit: l}
							got, err := s.Drain(ctx, r)
							want, wantErr := m.Drain(now, r)
							compare(fmt.Sprintf("Drain(%+v) at %d", r, now), got, err, want, wantErr)
						case 5:
							p, k, l := pick("refund")
							r := sluice.Request{Policy: p, Key: k, Cost: rapid.Int64Range(1, l.Capacity).Draw(rt, "refund cost"), Limit: l}
							if rapid.Bool().Draw(rt, "with a request ID") {
								r.RequestID = rapid.SampledFrom(ids).Draw(rt, "request ID")
							}
							got, err := s.Refund(ctx, r)
							want, wantErr := m.Refund(now, r)
							compare(fmt.Sprintf("Refund(%+v) at %d", r, now), got, err, want, wantErr)
						case 6:
							p, k, _ := pick("reset")
							err := s.Reset(ctx, p, k)
							wantErr := m.Reset(now, p, k)
							compare(fmt.Sprintf("Reset(%q, %q) at %d", p, k, now), nil, err, nil, wantErr)
						case 7:
							p, k, l := pick("peek")
							r := sluice.Request{Policy: p, Key: k, Cost: rapid.Int64Range(1, l.Capacity).Draw(rt, "cost"), Limit: l}
							got, err := s.Peek(ctx, r)
							want, wantErr := m.Peek(now, r)
							compare(fmt.Sprintf("Peek(%+v) at %d", r, now), got, err, want, wantErr)
						}
					}
				})
			})
		}
	}
}

// TestTakeAllConcurrentExact: 64 goroutines make multi-takes of two
// buckets of capacity 1,000 and 300 with the clock frozen: exactly 300 are
// allowed, each seeing its own Remaining of the small bucket, and the
// buckets end at 700 and 0 (no take half done, every refund exact). The
// buckets are one key under two policies (one slot), or two keys (on the
// cluster two slots, the small bucket's first or last), batched or not;
// and the same on Redis TIME with a refill far below a token.
func TestTakeAllConcurrentExact(t *testing.T) {
	const workers, per = 64, 10
	big := sluice.Limit{Capacity: 1000, Rate: sluice.Per(1, time.Hour)}
	small := sluice.Limit{Capacity: 300, Rate: sluice.Per(1, time.Hour)}
	keys := keysOfSlots(2) // ascending slots
	layouts := []struct {
		name                   string
		bigKey, smallKey       string
		bigPolicy, smallPolicy string
	}{
		{"one key", "u", "u", "daily", "burst"},
		{"small bucket's slot first", keys[1], keys[0], "tenant", "user"},
		{"small bucket's slot last", keys[0], keys[1], "tenant", "user"},
	}
	for name, c := range topologies(t) {
		for _, lay := range layouts {
			for _, batch := range batchModes {
				for _, clock := range []string{"frozen", "redis"} {
					t.Run(fmt.Sprintf("%s/%s/batch=%d/%s", name, lay.name, batch, clock), func(t *testing.T) {
						o := Options{Batch: batch}
						if clock == "frozen" {
							at := micros(1_000_000_000)
							o.Now, o.MinTTL = func() time.Time { return at }, time.Hour
						}
						s := newStore(t, c, o)
						ctx := t.Context()
						rs := []sluice.Request{
							{Policy: lay.bigPolicy, Key: lay.bigKey, Cost: 1, Limit: big},
							{Policy: lay.smallPolicy, Key: lay.smallKey, Cost: 1, Limit: small},
						}
						var (
							wg       sync.WaitGroup
							allowed  atomic.Int64
							seen     [300]atomic.Int32
							firstErr atomic.Pointer[error]
							badDeny  atomic.Int64
						)
						for range workers {
							wg.Go(func() {
								for range per {
									md, err := s.TakeAll(ctx, rs)
									if err != nil {
										firstErr.CompareAndSwap(nil, &err)
										return
									}
									if md.Allowed {
										allowed.Add(1)
										seen[md.Parts[1].Remaining].Add(1)
									} else if md.Denied != 1 || md.Parts[1].Allowed || !md.Parts[0].Allowed {
										badDeny.Add(1)
									}
								}
							})
						}
						wg.Wait()
						if p := firstErr.Load(); p != nil {
							t.Fatal(*p)
						}
						if got := allowed.Load(); got != small.Capacity {
							t.Fatalf("%d×%d concurrent TakeAll of (1000, 300) allowed %d, want exactly 300", workers, per, got)
						}
						for rem := range seen {
							if n := seen[rem].Load(); n != 1 {
								t.Fatalf("Remaining %d of the small bucket was seen by %d allowed multi-takes, want 1", rem, n)
							}
						}
						if n := badDeny.Load(); n > 0 {
							t.Errorf("%d denials did not name the small bucket (part 1) as the one short", n)
						}
						for i, want := range []int64{700, 0} {
							d, err := s.Peek(ctx, sluice.Request{Policy: rs[i].Policy, Key: rs[i].Key, Cost: 1, Limit: rs[i].Limit})
							if err != nil || d.Remaining != want {
								t.Errorf("after the flood bucket %d = %+v, %v; want Remaining %d", i, d, err, want)
							}
						}
						st := s.Stats()
						cross := name == "cluster" && lay.bigKey != lay.smallKey
						if (st.CrossSlotTakes > 0) != cross || st.LostRefunds != 0 {
							t.Errorf("Stats() = %+v; want CrossSlotTakes > 0 only for two slots on the cluster, and no lost refund", st)
						}
						// Batched, concurrent multi-takes of the same buckets
						// share script calls (on a standalone server, of any).
						if batch > 1 && !cross && st.SharedTakes == 0 {
							t.Errorf("Stats().SharedTakes = 0 after %d batched concurrent multi-takes", workers*per)
						}
					})
				}
			}
		}
	}
}

// failingClient is a cluster client whose "giveback" scripts fail before
// they are sent, as a refund to a node that went away would.
type failingClient struct {
	*redis.ClusterClient
	refused atomic.Int64
}

func (f *failingClient) Process(ctx context.Context, cmd redis.Cmder) error {
	if slices.Contains(cmd.Args(), any("giveback")) {
		f.refused.Add(1)
		err := fmt.Errorf("connection refused (a test refusing the refund)")
		cmd.SetErr(err)
		return err
	}
	return f.ClusterClient.Process(ctx, cmd)
}

// TestTakeAllAcrossSlots: on the cluster, a multi-take whose buckets lie
// in two slots and which the second slot denies gives back what the first
// took, so its bucket is left exactly as a denial leaves it (at a frozen
// clock: byte for byte), and the parts are the model's; if the refund
// cannot be sent the first bucket keeps the tokens taken, the denial is
// still returned and Stats().LostRefunds counts it; a value Sluice did not
// write in the second slot fails the call after giving back.
func TestTakeAllAcrossSlots(t *testing.T) {
	if testing.Short() {
		t.Skip("the cluster is skipped with -short")
	}
	c := redistest.ClusterClient(t)
	ctx := t.Context()
	keys := keysOfSlots(2)
	l := sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Hour)}
	const now = 1_000_000_000
	rs := []sluice.Request{{Policy: "p", Key: keys[1], Cost: 5, Limit: l}, {Policy: "p", Key: keys[0], Cost: 3, Limit: l}}
	setup := func(t *testing.T, client Client) (*Store, *sluicetest.Model) {
		t.Helper()
		s, err := New(client, Options{Prefix: newPrefix(t, c), Now: func() time.Time { return micros(now) }, MinTTL: time.Hour, Batch: 1})
		if err != nil {
			t.Fatal(err)
		}
		m := sluicetest.NewModel(time.Microsecond, sluice.KeepTokens, time.Minute)
		// The first slot's bucket (part 1) holds 7, the second's (part 0)
		// 2: part 0 denies.
		for _, r := range []sluice.Request{{Policy: "p", Key: keys[0], Cost: 3, Limit: l}, {Policy: "p", Key: keys[1], Cost: 8, Limit: l}} {
			if _, err := s.Take(ctx, r); err != nil {
				t.Fatal(err)
			}
			if _, err := m.Take(now, r); err != nil {
				t.Fatal(err)
			}
		}
		return s, m
	}
	t.Run("denied", func(t *testing.T) {
		s, m := setup(t, c)
		first := s.bucketKey("p", keys[0])
		before, err := c.Get(ctx, first).Result()
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.TakeAll(ctx, rs)
		want, _ := m.TakeAll(now, rs)
		if err != nil || !cmp.Equal(got, want) {
			t.Fatalf("TakeAll = %+v, %v; want %+v (the model's)", got, err, want)
		}
		if after, err := c.Get(ctx, first).Result(); err != nil || after != before {
			t.Errorf("the first slot's bucket went from %q to %q, %v; want it as it was", before, after, err)
		}
		if st := s.Stats(); st.CrossSlotTakes != 1 || st.LostRefunds != 0 {
			t.Errorf("Stats() = %+v; want 1 cross-slot take, no lost refund", st)
		}
	})
	t.Run("refund lost", func(t *testing.T) {
		fc := &failingClient{ClusterClient: c}
		s, m := setup(t, fc)
		got, err := s.TakeAll(ctx, rs)
		want, _ := m.TakeAll(now, rs)
		if err != nil || got.Allowed || got.Denied != 0 || fc.refused.Load() != 1 {
			t.Fatalf("TakeAll with the refund refused = %+v, %v (%d refunds refused); want the denial by part 0 and one refund tried", got, err, fc.refused.Load())
		}
		// Part 1 reports its bucket as the take left it: 3 tokens lost.
		want.Parts[1].Remaining -= 3
		want.Parts[1].ResetAfter += 3 * time.Hour
		if !cmp.Equal(got, want) {
			t.Errorf("TakeAll = %+v; want %+v (part 1 charged)", got, want)
		}
		if d, err := s.Peek(ctx, sluice.Request{Policy: "p", Key: keys[0], Cost: 1, Limit: l}); err != nil || d.Remaining != 4 {
			t.Errorf("Peek of the first slot's bucket = %+v, %v; want 4 (7 less the 3 taken and not given back)", d, err)
		}
		if st := s.Stats(); st.LostRefunds != 1 {
			t.Errorf("Stats().LostRefunds = %d, want 1", st.LostRefunds)
		}
	})
	t.Run("foreign value in the second slot", func(t *testing.T) {
		s, _ := setup(t, c)
		first := s.bucketKey("p", keys[0])
		before, err := c.Get(ctx, first).Result()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Set(ctx, s.bucketKey("p", keys[1]), "another app's value", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if md, err := s.TakeAll(ctx, rs); !errors.Is(err, sluice.ErrMisconfigured) {
			t.Fatalf("TakeAll = %+v, %v; want an error wrapping %v", md, err, sluice.ErrMisconfigured)
		}
		if after, err := c.Get(ctx, first).Result(); err != nil || after != before {
			t.Errorf("the first slot's bucket went from %q to %q, %v; want it given back as it was", before, after, err)
		}
	})
}

// TestGroups: a multi-take's buckets go in one script on a standalone
// server and whenever they are of one key; on a Cluster one script per
// slot, in ascending slot order, each part in its request's order; on a
// Ring one script per key.
func TestGroups(t *testing.T) {
	keys := keysOfSlots(3)
	rs := []sluice.Request{
		{Policy: "a", Key: keys[2]}, {Policy: "a", Key: keys[0]}, {Policy: "b", Key: keys[2]}, {Policy: "b", Key: keys[1]},
	}
	oneKey := []sluice.Request{{Policy: "a", Key: "u"}, {Policy: "b", Key: "u"}}
	tests := []struct {
		spread spread
		rs     []sluice.Request
		want   [][]int
	}{
		{anyKeys, rs, [][]int{{0, 1, 2, 3}}},
		{slotKeys, rs, [][]int{{1}, {3}, {0, 2}}},
		{tagKeys, rs, [][]int{{1}, {3}, {0, 2}}},
		{slotKeys, oneKey, [][]int{{0, 1}}},
		{tagKeys, oneKey, [][]int{{0, 1}}},
	}
	for _, tt := range tests {
		s := &Store{spread: tt.spread}
		if got := s.groups(tt.rs); !cmp.Equal(got, tt.want) {
			t.Errorf("spread %d: groups(%+v) = %v, want %v", tt.spread, tt.rs, got, tt.want)
		}
	}
	// Two keys of one slot share a script on a Cluster, not on a Ring.
	a := "user-0"
	var b string
	for i := 1; b == ""; i++ {
		if k := fmt.Sprint("other-", i); clusterSlot(k) == clusterSlot(a) {
			b = k
		}
	}
	two := []sluice.Request{{Policy: "p", Key: a}, {Policy: "p", Key: b}}
	if got := (&Store{spread: slotKeys}).groups(two); len(got) != 1 {
		t.Errorf("cluster: keys %q and %q of slot %d in groups %v, want one", a, b, clusterSlot(a), got)
	}
	if got := (&Store{spread: tagKeys}).groups(two); len(got) != 2 {
		t.Errorf("ring: keys %q and %q in groups %v, want two", a, b, got)
	}
}

// countingClient counts the commands it is asked to send.
type countingClient struct {
	Client
	n atomic.Int64
}

func (c *countingClient) Process(ctx context.Context, cmd redis.Cmder) error {
	c.n.Add(1)
	return c.Client.Process(ctx, cmd)
}

// TestOpsBadInputSendsNothing: every bad input of the operations, and every
// limit the store cannot decide, is an error wrapping its sentinel that
// names the value, and nothing is sent to Redis.
func TestOpsBadInputSendsNothing(t *testing.T) {
	cc := &countingClient{Client: offline(t)}
	s, err := New(cc, Options{Batch: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
	exactless := sluice.Limit{Capacity: 143, Rate: sluice.Every(sluice.MaxPeriod)}
	nanos := sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Second+time.Nanosecond)}
	r := func(key string, cost int64, l sluice.Limit) sluice.Request {
		return sluice.Request{Policy: testPolicy, Key: key, Cost: cost, Limit: l}
	}
	many := make([]sluice.Request, sluice.MaxParts+1)
	for i := range many {
		many[i] = r(fmt.Sprint("k", i), 1, l)
	}
	withID := r("k", 1, l)
	withID.RequestID = "id"
	multis := []struct {
		name string
		rs   []sluice.Request
		want error
		says string
	}{
		{"none", nil, sluice.ErrInvalidMulti, "1 to 16"},
		{"too many", many, sluice.ErrInvalidMulti, "17 buckets"},
		{"twice", []sluice.Request{r("k", 1, l), r("k", 2, l)}, sluice.ErrInvalidMulti, `key "k"`},
		{"request ID", []sluice.Request{r("j", 1, l), withID}, sluice.ErrInvalidRequestID, "bucket 1"},
		{"cost", []sluice.Request{r("j", 1, l), r("k", 11, l)}, sluice.ErrInvalidCost, "[1, 10]"},
		{"exactness", []sluice.Request{r("j", 1, l), r("k", 1, exactless)}, sluice.ErrInvalidLimit, "bucket 1"},
		{"microseconds", []sluice.Request{r("k", 1, nanos)}, sluice.ErrInvalidLimit, "microseconds"},
	}
	for _, tt := range multis {
		if md, err := s.TakeAll(ctx, tt.rs); !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.says) {
			t.Errorf("TakeAll %s = %+v, %v; want an error wrapping %v that says %q", tt.name, md, err, tt.want, tt.says)
		}
	}
	singles := []struct {
		name       string
		r          sluice.Request
		drain      error // nil: valid for Drain
		refund     error
		says       string
		drainSays  string
		refundSays string
	}{
		{"cost 0", r("k", 0, l), sluice.ErrInvalidCost, sluice.ErrInvalidCost, "cost 0", "", ""},
		{"cost above the capacity", r("k", 11, l), nil, sluice.ErrInvalidCost, "cost 11", "", ""},
		{"request ID", withID, sluice.ErrInvalidRequestID, nil, "request ID", "", ""},
		{"exactness", r("k", 1, exactless), sluice.ErrInvalidLimit, sluice.ErrInvalidLimit, "2^52", "", ""},
		{"microseconds", r("k", 1, nanos), sluice.ErrInvalidLimit, sluice.ErrInvalidLimit, "microseconds", "", ""},
		{"no key", r("", 1, l), sluice.ErrInvalidKey, sluice.ErrInvalidKey, "key", "", ""},
	}
	for _, tt := range singles {
		if tt.drain != nil {
			if d, err := s.Drain(ctx, tt.r); !errors.Is(err, tt.drain) || !strings.Contains(err.Error(), tt.says) {
				t.Errorf("Drain %s = %+v, %v; want an error wrapping %v that says %q", tt.name, d, err, tt.drain, tt.says)
			}
		}
		if tt.refund != nil {
			if d, err := s.Refund(ctx, tt.r); !errors.Is(err, tt.refund) || !strings.Contains(err.Error(), tt.says) {
				t.Errorf("Refund %s = %+v, %v; want an error wrapping %v that says %q", tt.name, d, err, tt.refund, tt.says)
			}
		}
	}
	for _, c := range []struct {
		policy, key string
		want        error
	}{{"", "k", sluice.ErrInvalidPolicy}, {"a b", "k", sluice.ErrInvalidPolicy}, {testPolicy, "", sluice.ErrInvalidKey}, {testPolicy, strings.Repeat("k", sluice.MaxKeyLen+1), sluice.ErrInvalidKey}} {
		if err := s.Reset(ctx, c.policy, c.key); !errors.Is(err, c.want) {
			t.Errorf("Reset(%q, %d bytes) = %v, want an error wrapping %v", c.policy, len(c.key), err, c.want)
		}
	}
	if n := cc.n.Load(); n != 0 {
		t.Errorf("%d commands were sent for bad input; want none", n)
	}
}

// TestOpsRefuseForeignValues: a bucket or record key holding a value the
// store did not write (another type, text, numbers out of range) fails
// every operation with a *ScriptError wrapping sluice.ErrMisconfigured,
// and every key of the call is left as it was: a multi-take whose second
// bucket is foreign leaves its first bucket alone too.
func TestOpsRefuseForeignValues(t *testing.T) {
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(3)}
	for name, c := range topologies(t) {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			s := newStore(t, c, Options{})
			good, bad := s.bucketKey("good", "k"), s.bucketKey(testPolicy, "k")
			record := s.recordKey(testPolicy, "k", "id")
			foreign := func(tokens, frac, stamp int64) string {
				return s.spec(plan{c: 10, n: 3, p: 1_000_000, n1: 3, p1: 1_000_000}) + levelBytes(tokens, frac, stamp)
			}
			values := []struct {
				name string
				key  string
				set  func(key string) error
			}{
				{"a hash", bad, func(k string) error { return c.HSet(ctx, k, "tokens", "1").Err() }},
				{"text", bad, func(k string) error { return c.Set(ctx, k, "hello", 0).Err() }},
				{"tokens above capacity", bad, func(k string) error { return c.Set(ctx, k, foreign(11, 0, 5), 0).Err() }},
				{"a fraction of a whole token", bad, func(k string) error { return c.Set(ctx, k, foreign(1, 1_000_000, 5), 0).Err() }},
				{"a list as the record", record, func(k string) error { return c.RPush(ctx, k, "x").Err() }},
				{"text as the record", record, func(k string) error { return c.Set(ctx, k, "x", 0).Err() }},
				{"a record with a bad mark", record, func(k string) error {
					return c.Set(ctx, k, "5 1 10 3 1000000 1 9 0 333334 x", 0).Err()
				}},
			}
			ops := []struct {
				name   string
				record bool // the operation reads the record
				do     func() error
			}{
				{"TakeAll", false, func() error {
					_, err := s.TakeAll(ctx, []sluice.Request{{Policy: "good", Key: "k", Cost: 1, Limit: l}, {Policy: testPolicy, Key: "k", Cost: 1, Limit: l}})
					return err
				}},
				{"Drain", false, func() error {
					_, err := s.Drain(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 20, Limit: l})
					return err
				}},
				{"Refund", false, func() error {
					_, err := s.Refund(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: l})
					return err
				}},
				{"Refund with a request ID", true, func() error {
					_, err := s.Refund(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: l, RequestID: "id"})
					return err
				}},
				{"Reset", false, func() error { return s.Reset(ctx, testPolicy, "k") }},
			}
			dump := func() [3]string {
				var d [3]string
				for i, k := range []string{good, bad, record} {
					d[i], _ = c.Dump(ctx, k).Result()
				}
				return d
			}
			for _, v := range values {
				for _, op := range ops {
					if v.key == record && !op.record {
						continue
					}
					t.Run(v.name+"/"+op.name, func(t *testing.T) {
						if err := deleteKeys(ctx, c, s.prefix); err != nil {
							t.Fatal(err)
						}
						// The good bucket and the bucket of the request
						// ID are in use, with the ID remembered.
						if _, err := s.Take(ctx, sluice.Request{Policy: "good", Key: "k", Cost: 4, Limit: l}); err != nil {
							t.Fatal(err)
						}
						if v.key == record {
							if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 2, Limit: l}); err != nil {
								t.Fatal(err)
							}
						}
						if err := v.set(v.key); err != nil {
							t.Fatal(err)
						}
						before := dump()
						err := op.do()
						var se *ScriptError
						if !errors.As(err, &se) || !errors.Is(err, sluice.ErrMisconfigured) || sluice.IsUnavailable(err) || sluice.IsInvalid(err) {
							t.Errorf("%s = %v (%T); want a *ScriptError wrapping %v alone", op.name, err, err, sluice.ErrMisconfigured)
						}
						if after := dump(); after != before {
							t.Errorf("%s changed the keys from %q to %q", op.name, before, after)
						}
					})
				}
			}
		})
	}
}

// TestOpsTTLs: the keys the operations write expire as a take's do: a
// drained bucket 1 ms after it is full again, a bucket refunded or reset
// to full 1 ms after its stamp; a refund by request ID leaves the record's
// expiry as the take set it.
func TestOpsTTLs(t *testing.T) {
	c := redistest.Client(t)
	ctx := t.Context()
	s := newStore(t, c, Options{RequestIDTTL: 90 * time.Second})
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(2)}
	r := sluice.Request{Policy: testPolicy, Key: "k", Cost: 3, Limit: l}
	pttl := func(key string) time.Duration {
		t.Helper()
		d, err := c.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	between := func(what string, got, lo, hi time.Duration) {
		t.Helper()
		if got < lo || got > hi {
			t.Errorf("%s: PTTL %v, want between %v and %v", what, got, lo, hi)
		}
	}
	bucket := s.bucketKey(testPolicy, "k")
	// Drained by 3: full again in 1.5 s.
	if _, err := s.Drain(ctx, r); err != nil {
		t.Fatal(err)
	}
	between("drain", pttl(bucket), 1400*time.Millisecond, 1501*time.Millisecond)
	// A refund to full: the bucket expires at once.
	if _, err := s.Refund(ctx, r); err != nil {
		t.Fatal(err)
	}
	if got := pttl(bucket); got != -2 && got > 2*time.Millisecond {
		t.Errorf("bucket refunded to full: PTTL %v, want at most 2ms (or gone)", got)
	}
	// A take with a request ID, then its refund: the record keeps the
	// expiry the take set.
	id := r
	id.RequestID = "id"
	if _, err := s.Take(ctx, id); err != nil {
		t.Fatal(err)
	}
	record := s.recordKey(testPolicy, "k", "id")
	between("record after the take", pttl(record), 89*time.Second, 90*time.Second+time.Millisecond)
	if err := c.PExpire(ctx, record, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if d, err := s.Refund(ctx, id); err != nil || d.Taken != -3 {
		t.Fatalf("Refund by request ID = %+v, %v; want 3 given back", d, err)
	}
	between("record after the refund", pttl(record), 59*time.Minute, time.Hour)
	// Reset: full, expiring at once.
	if _, err := s.Drain(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := s.Reset(ctx, testPolicy, "k"); err != nil {
		t.Fatal(err)
	}
	if got := pttl(bucket); got != -2 && got > 2*time.Millisecond {
		t.Errorf("bucket reset: PTTL %v, want at most 2ms (or gone)", got)
	}
	// A multi-take writes each bucket with its own expiry.
	other := sluice.Limit{Capacity: 4, Rate: sluice.PerSecond(1)}
	if _, err := s.TakeAll(ctx, []sluice.Request{r, {Policy: "other", Key: "k", Cost: 2, Limit: other}}); err != nil {
		t.Fatal(err)
	}
	between("multi-take, part 0", pttl(bucket), 1400*time.Millisecond, 1501*time.Millisecond)
	between("multi-take, part 1", pttl(s.bucketKey("other", "k")), 1900*time.Millisecond, 2001*time.Millisecond)
}

// TestQuietMultiDenials: on Redis TIME a denied multi-take leaves the
// buckets stored under their specs as they were, with their expiry (it
// takes nothing, as a denial on the single take's fast path), whether
// they covered their costs or not.
func TestQuietMultiDenials(t *testing.T) {
	c := redistest.Client(t)
	ctx := t.Context()
	s := newStore(t, c, Options{})
	l := sluice.Limit{Capacity: 2, Rate: sluice.Per(1, time.Hour)}
	before := emptyMarked(t, c, s, "empty", l)
	full := sluice.Limit{Capacity: 5, Rate: sluice.Per(1, time.Hour)}
	if _, err := s.Take(ctx, sluice.Request{Policy: "full", Key: "empty", Cost: 1, Limit: full}); err != nil {
		t.Fatal(err)
	}
	if err := c.PExpire(ctx, s.bucketKey("full", "empty"), 10*time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	fullBefore, _ := valueAndPTTL(t, c, s.bucketKey("full", "empty"))
	time.Sleep(2 * time.Millisecond)
	md, err := s.TakeAll(ctx, []sluice.Request{
		{Policy: "full", Key: "empty", Cost: 1, Limit: full},
		{Policy: testPolicy, Key: "empty", Cost: 1, Limit: l},
	})
	if err != nil || md.Allowed || md.Denied != 1 {
		t.Fatalf("TakeAll = %+v, %v; want denied by part 1", md, err)
	}
	for _, k := range []struct{ key, value string }{{s.bucketKey(testPolicy, "empty"), before}, {s.bucketKey("full", "empty"), fullBefore}} {
		if after, pttl := valueAndPTTL(t, c, k.key); after != k.value || pttl < 9*time.Hour {
			t.Errorf("%q: value %q → %q, PTTL %v; want it left as it was", k.key, k.value, after, pttl)
		}
	}
}

// TestScriptRejectsBadOpArguments calls the script's operations beyond
// take and peek directly, past the Go checks, with every text argument
// replaced by each value Lua would misread or one out of range, every spec
// of a further part replaced by one out of range, and every wrong shape:
// each call must fail with a sluice error and write nothing.
func TestScriptRejectsBadOpArguments(t *testing.T) {
	c := redistest.Client(t)
	ctx := t.Context()
	prefix := newPrefix(t, c)
	s, err := New(c, Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	a, b := s.bucketKey(testPolicy, "a"), s.bucketKey(testPolicy, "b")
	rec := s.recordKey(testPolicy, "a", "id")
	spec := specArg(plan{c: 10, n: 3, p: 1_000_000, n1: 3, p1: 1_000_000}, 0, 0)
	edges := []string{"nan", "inf", "-inf", "1e309", "0x10", "-0", "-1", " 12 ", "12 ", "1.5", "1e8", "01", "9007199254740993", "9007199254740992", "99999999999999999999", ""}
	badSpecs := map[string]string{
		"short":                  spec[:specLen-1],
		"long":                   spec + "\x00",
		"capacity 0":             specArg(plan{c: 0, n: 3, p: 1_000_000, n1: 3, p1: 1_000_000}, 0, 0),
		"rate not reduced":       specArg(plan{c: 10, n: 2, p: 1_000_000, n1: 2, p1: 1_000_000}, 0, 0),
		"capacity × period 2^52": specArg(plan{c: 1 << 40, n: 1, p: 4096, n1: 1, p1: 4096}, 0, 0),
		"conversion 3":           specArg(plan{c: 10, n: 3, p: 1_000_000, n1: 3, p1: 1_000_000}, 3, 0),
		"least TTL 2^53":         specArg(plan{c: 10, n: 3, p: 1_000_000, n1: 3, p1: 1_000_000}, 0, 1<<53),
	}
	type call struct {
		name string
		keys []string
		args []string
		text []int // the indexes of args holding decimal text
		spec []int // the indexes of args holding a further part's spec
	}
	valid := []call{
		{"all", []string{a, b}, []string{"all", "1000000", spec, "1", spec, "2"}, []int{1, 3, 5}, []int{4}},
		{"deny", []string{a, b}, []string{"deny", "1000000", spec, "1", spec, "2"}, []int{1, 3, 5}, []int{4}},
		{"giveback", []string{a, b}, []string{"giveback", "1000000", spec, "1", spec, "2"}, []int{1, 3, 5}, []int{4}},
		{"drain", []string{a}, []string{"drain", "1000000", spec, "3"}, []int{1, 3}, nil},
		{"refund", []string{a}, []string{"refund", "1000000", spec, "3"}, []int{1, 3}, nil},
		{"refund with a request ID", []string{a, rec}, []string{"refund", "1000000", spec, "3", "60000000"}, []int{1, 3, 4}, nil},
	}
	run := func(keys, args []string) error {
		v := make([]any, len(args))
		for i, x := range args {
			v[i] = x
		}
		return redis.NewScript(script).Run(ctx, c, keys, v...).Err()
	}
	var calls []call
	for _, v := range valid {
		if err := run(v.keys, v.args); err != nil {
			t.Fatalf("the valid %s fails: %v", v.name, err)
		}
		for _, i := range v.text {
			for _, e := range edges {
				args := slices.Clone(v.args)
				args[i] = e
				calls = append(calls, call{name: fmt.Sprintf("%s, argument %d = %q", v.name, i+1, e), keys: v.keys, args: args})
			}
		}
		for _, i := range v.spec {
			for name, bad := range badSpecs {
				args := slices.Clone(v.args)
				args[i] = bad
				calls = append(calls, call{name: fmt.Sprintf("%s, spec %d %s", v.name, i+1, name), keys: v.keys, args: args})
			}
		}
		calls = append(calls,
			call{name: v.name + ", a cost above the capacity", keys: v.keys, args: append(slices.Clone(v.args[:3]), append([]string{"11"}, v.args[4:]...)...)},
			call{name: v.name + ", an argument too many", keys: v.keys, args: append(slices.Clone(v.args), "1")},
			call{name: v.name + ", an argument short", keys: v.keys, args: v.args[:len(v.args)-1]},
			call{name: v.name + ", a key too many", keys: append(slices.Clone(v.keys), s.bucketKey(testPolicy, "c")), args: v.args},
		)
	}
	if err := deleteKeys(ctx, c, prefix); err != nil {
		t.Fatal(err)
	}
	many := make([]string, 17)
	manyArgs := []string{"all", "1000000"}
	for i := range many {
		many[i] = s.bucketKey(testPolicy, fmt.Sprint("m", i))
		manyArgs = append(manyArgs, spec, "1")
	}
	calls = append(calls,
		call{name: "all, the same bucket twice", keys: []string{a, a}, args: []string{"all", "1000000", spec, "1", spec, "1"}},
		call{name: "all, 17 buckets", keys: many, args: manyArgs},
		call{name: "all, no key", keys: nil, args: []string{"all", "1000000"}},
		call{name: "drain with a request-ID key", keys: []string{a, rec}, args: []string{"drain", "1000000", spec, "3", "60000000"}},
	)
	for _, tt := range calls {
		t.Run(tt.name, func(t *testing.T) {
			if err := run(tt.keys, tt.args); err == nil || !strings.Contains(err.Error(), "sluice:") {
				t.Errorf("script(%q) = %v, want a sluice error", tt.args, err)
			}
			if left, err := scanKeys(ctx, c, prefix); err != nil || len(left) != 0 {
				t.Errorf("after script(%q): keys %q, %v; want none written", tt.args, left, err)
			}
		})
	}

	// "reset" of a bucket in use: bad time, bad least TTL, wrong shapes.
	value := stateValue(s, sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(3)}, bucket.State{Tokens: 2, Stamp: 1_000_000})
	if err := c.Set(ctx, a, value, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	var resets [][]string
	for _, e := range edges {
		resets = append(resets, []string{"reset", e, "0"}, []string{"reset", "1000000", e})
	}
	resets = append(resets, []string{"reset", "1000000"}, []string{"reset", "1000000", "0", "0"}, []string{"reset", "1000000", spec})
	for _, args := range resets {
		if err := run([]string{a}, args); err == nil || !strings.Contains(err.Error(), "sluice:") {
			t.Errorf("script(%q) = %v, want a sluice error", args, err)
		}
		if got, err := c.Get(ctx, a).Result(); err != nil || got != value {
			t.Errorf("after script(%q) the bucket is %q, %v; want it left as %q", args, got, err, value)
		}
	}
	if err := run([]string{a, b}, []string{"reset", "1000000", "0"}); err == nil || !strings.Contains(err.Error(), "sluice:") {
		t.Errorf("reset of two keys = %v, want a sluice error", err)
	}
	if err := run([]string{a}, []string{"reset", "1000000", "0"}); err != nil {
		t.Fatalf("the valid reset fails: %v", err)
	}
	if got, err := c.Get(ctx, a).Result(); err != nil || got != stateValue(s, sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(3)}, bucket.State{Tokens: 10, Stamp: 1_000_000}) {
		t.Errorf("after the valid reset the bucket is %q, %v; want it full at its stamp", got, err)
	}
}

// TestScriptMultiMatchesPlan checks a multi-take script call against
// bucket.Plan on states drawn directly, as TestScriptMatchesPlan does for a
// take: two or three buckets under limits at the edge of what the store
// accepts, each missing or stored (on the old limit's grid, stamped around
// now, sometimes after it), some converted to a new limit, each with its
// own cost. Each part's decision must be Plan's (a take if every bucket
// covers its cost, else a peek), and so must the state stored. Both the
// fast path and the general path meet these states.
func TestScriptMultiMatchesPlan(t *testing.T) {
	c := redistest.Client(t)
	ctx := context.Background()
	prefix := newPrefix(t, c)
	s, err := New(c, Options{Prefix: prefix, MinTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	rapid.Check(t, func(rt *rapid.T) {
		now := rapid.Int64Range(0, maxExact).Draw(rt, "now")
		n := rapid.IntRange(1, 3).Draw(rt, "parts")
		keys := make([]string, n)
		plans := make([]bucket.Plan, n)
		want := make([]bucket.State, n)
		costs := make([]int64, n)
		limits := make([]sluice.Limit, n)
		values := make([]string, n)
		args := []any{"evalsha", scriptSHA, n}
		for i := range n {
			keys[i] = s.bucketKey(fmt.Sprint("p", i), "k")
			args = append(args, keys[i])
		}
		args = append(args, "all", now)
		for i := range n {
			from := edgeLimit(rt, "old")
			to := from
			if rapid.IntRange(0, 3).Draw(rt, "limit change (0)") == 0 {
				to = edgeLimit(rt, "new")
			}
			oldPlan, err := bucket.NewPlan(from, time.Microsecond)
			if err != nil {
				rt.Fatal(err)
			}
			if plans[i], err = bucket.NewPlan(to, time.Microsecond); err != nil {
				rt.Fatal(err)
			}
			limits[i] = to
			if rapid.Bool().Draw(rt, "missing") {
				if err := c.Del(ctx, keys[i]).Err(); err != nil {
					rt.Fatal(err)
				}
				want[i], values[i] = plans[i].Full(now), "(missing)"
			} else {
				var st bucket.State
				st.Tokens = rapid.Int64Range(0, from.Capacity).Draw(rt, "tokens")
				if st.Tokens < from.Capacity {
					st.Frac = uint64(rapid.Int64Range(0, int64(oldPlan.Scale())-1).Draw(rt, "frac"))
				}
				st.Stamp = rapid.Int64Range(max(0, now-int64(2*oldPlan.Scale())), min(maxExact, now+1000)).Draw(rt, "stamp")
				values[i] = stateValue(s, from, st)
				if err := c.Set(ctx, keys[i], values[i], time.Minute).Err(); err != nil {
					rt.Fatal(err)
				}
				want[i] = oldPlan.Refill(st, now)
				if from != to {
					want[i] = plans[i].Convert(want[i], &oldPlan, sluice.KeepTokens)
				}
			}
			costs[i] = rapid.Int64Range(1, to.Capacity).Draw(rt, "cost")
			pl, err := compile(to)
			if err != nil {
				rt.Fatal(err)
			}
			args = append(args, s.spec(pl), costs[i])
		}
		all := true
		for i := range n {
			all = all && plans[i].Peek(want[i], now, costs[i]).Allowed
		}
		reply, err := decisionCmdReply(ctx, c, args)
		if err != nil {
			rt.Fatalf("all %v of %q at %d: %v", costs, values, now, err)
		}
		if len(reply) != 5*n {
			rt.Fatalf("reply %q has %d values for %d parts", reply, len(reply), n)
		}
		for i := range n {
			var wantD sluice.Decision
			if all {
				plans[i].Take(&want[i], now, costs[i], &wantD)
			} else {
				wantD = plans[i].Peek(want[i], now, costs[i])
			}
			got, _, err := decision(reply[5*i:5*i+5], limits[i])
			if err != nil {
				rt.Fatal(err)
			}
			if diff := cmp.Diff(wantD, got); diff != "" {
				rt.Fatalf("part %d of all %v of %q at %d (-Plan +script):\n%s", i, costs, values, now, diff)
			}
			if stored, err := c.Get(ctx, keys[i]).Result(); err != nil || stored != stateValue(s, limits[i], want[i]) {
				rt.Fatalf("part %d stored %q, %v; want Plan's %q", i, stored, err, stateValue(s, limits[i], want[i]))
			}
		}
	})
}

// TestScriptSharedMultiTakes: one "alls" script call (how a batch sends
// multi-takes under the same limits) decides its multi-takes one after
// another at one time, each all or nothing, as bucket.Plan does, on
// buckets met again by later multi-takes, stored or missing, under limit
// changes, and stores Plan's final state of each.
func TestScriptSharedMultiTakes(t *testing.T) {
	c := redistest.Client(t)
	ctx := context.Background()
	prefix := newPrefix(t, c)
	s, err := New(c, Options{Prefix: prefix, MinTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	rapid.Check(t, func(rt *rapid.T) {
		now := rapid.Int64Range(0, maxExact).Draw(rt, "now")
		k := rapid.IntRange(1, 3).Draw(rt, "parts")
		m := rapid.IntRange(1, 5).Draw(rt, "multi-takes")
		// Part i is always policy p<i>, under limit to[i]; each multi-take
		// picks one of two keys for each part.
		plans := make([]bucket.Plan, k)
		limits := make([]sluice.Limit, k)
		want := map[string]*bucket.State{}
		values := map[string]string{}
		args := []any{"evalsha", scriptSHA, k * m}
		var keys []string
		which := make([][]int, m)
		for q := range m {
			which[q] = rapid.SliceOfN(rapid.IntRange(0, 1), k, k).Draw(rt, "keys")
		}
		specs := make([]any, k)
		for i := range k {
			from := edgeLimit(rt, "old")
			limits[i] = from
			if rapid.IntRange(0, 3).Draw(rt, "limit change (0)") == 0 {
				limits[i] = edgeLimit(rt, "new")
			}
			oldPlan, err := bucket.NewPlan(from, time.Microsecond)
			if err != nil {
				rt.Fatal(err)
			}
			if plans[i], err = bucket.NewPlan(limits[i], time.Microsecond); err != nil {
				rt.Fatal(err)
			}
			pl, err := compile(limits[i])
			if err != nil {
				rt.Fatal(err)
			}
			specs[i] = s.spec(pl)
			for w := range 2 {
				key := s.bucketKey(fmt.Sprint("p", i), fmt.Sprint("k", w))
				if rapid.Bool().Draw(rt, "missing") {
					if err := c.Del(ctx, key).Err(); err != nil {
						rt.Fatal(err)
					}
					st := plans[i].Full(now)
					want[key], values[key] = &st, "(missing)"
					continue
				}
				var st bucket.State
				st.Tokens = rapid.Int64Range(0, from.Capacity).Draw(rt, "tokens")
				if st.Tokens < from.Capacity {
					st.Frac = uint64(rapid.Int64Range(0, int64(oldPlan.Scale())-1).Draw(rt, "frac"))
				}
				st.Stamp = rapid.Int64Range(max(0, now-int64(2*oldPlan.Scale())), min(maxExact, now+1000)).Draw(rt, "stamp")
				values[key] = stateValue(s, from, st)
				if err := c.Set(ctx, key, values[key], time.Minute).Err(); err != nil {
					rt.Fatal(err)
				}
				st = oldPlan.Refill(st, now)
				if from != limits[i] {
					st = plans[i].Convert(st, &oldPlan, sluice.KeepTokens)
				}
				want[key] = &st
			}
		}
		costs := make([][]int64, m)
		for q := range m {
			costs[q] = make([]int64, k)
			for i := range k {
				key := s.bucketKey(fmt.Sprint("p", i), fmt.Sprint("k", which[q][i]))
				keys = append(keys, key)
				args = append(args, key)
				costs[q][i] = rapid.Int64Range(1, limits[i].Capacity).Draw(rt, "cost")
			}
		}
		args = append(args, "alls", now)
		args = append(args, specs...)
		for q := range m {
			for i := range k {
				args = append(args, costs[q][i])
			}
		}
		reply, err := decisionCmdReply(ctx, c, args)
		if err != nil {
			rt.Fatalf("alls %v of %q at %d: %v", costs, values, now, err)
		}
		if len(reply) != 5*k*m {
			rt.Fatalf("reply %q has %d values for %d multi-takes of %d parts", reply, len(reply), m, k)
		}
		for q := range m {
			all := true
			for i := range k {
				all = all && plans[i].Peek(*want[keys[q*k+i]], now, costs[q][i]).Allowed
			}
			for i := range k {
				var wantD sluice.Decision
				if all {
					plans[i].Take(want[keys[q*k+i]], now, costs[q][i], &wantD)
				} else {
					wantD = plans[i].Peek(*want[keys[q*k+i]], now, costs[q][i])
				}
				r := 5 * (q*k + i)
				got, _, err := decision(reply[r:r+5], limits[i])
				if err != nil {
					rt.Fatal(err)
				}
				if diff := cmp.Diff(wantD, got); diff != "" {
					rt.Fatalf("multi-take %d part %d of %v (%q) at %d (-Plan +script):\n%s", q, i, costs, values, now, diff)
				}
			}
		}
		for i, key := range keys {
			if stored, err := c.Get(ctx, key).Result(); err != nil || stored != stateValue(s, limits[i%k], *want[key]) {
				rt.Fatalf("bucket %q stored %q, %v; want Plan's %q", key, stored, err, stateValue(s, limits[i%k], *want[key]))
			}
		}
	})
}

// TestGroupMultiTakes: in a pipeline, multi-takes share a script call when
// they have the same number of parts, time and specs in order (and, off a
// standalone server, the same buckets), and every bucket is under one spec
// in all of them; takes share only with takes, and anything else goes
// alone.
func TestGroupMultiTakes(t *testing.T) {
	multi := func(now any, parts ...string) *pending {
		args := []any{"evalsha", scriptSHA, len(parts) / 2}
		for i := 0; i < len(parts); i += 2 {
			args = append(args, parts[i])
		}
		args = append(args, "all", now)
		for i := 1; i < len(parts); i += 2 {
			args = append(args, parts[i], int64(1))
		}
		return &pending{cmd: decisionCmd{redis.NewCmd(context.Background(), args...)}}
	}
	take := func(key, spec string) *pending {
		return &pending{cmd: decisionCmd{redis.NewCmd(context.Background(), "evalsha", scriptSHA, 1, key, "take", "redis", spec, int64(1))}}
	}
	batch := []*pending{
		multi("redis", "burst:a", "S1", "daily:a", "S2"),  // 0
		multi("redis", "burst:b", "S1", "daily:b", "S2"),  // 1: shares with 0 on a standalone server
		multi("redis", "burst:a", "S1", "daily:a", "S2"),  // 2: shares with 0 anywhere
		multi("redis", "daily:a", "S1", "burst:a", "S2"),  // 3: daily:a under S1: a group of its own
		multi("redis", "burst:a", "S2", "daily:a", "S1"),  // 4: other specs in order
		multi(int64(5), "burst:a", "S1", "daily:a", "S2"), // 5: another time
		multi("redis", "burst:a", "S1"),                   // 6: one part
		take("burst:a", "S1"),                             // 7
		take("burst:a", "S1"),                             // 8: shares with 7
		multi("redis", "burst:c", "S1", "daily:c", "S2"),  // 9: on a standalone server with 3, the latest group of its kind
	}
	for _, tt := range []struct {
		anyKey bool
		want   [][]int
	}{
		{true, [][]int{{0, 1, 2}, {3, 9}, {4}, {5}, {6}, {7, 8}}},
		{false, [][]int{{0, 2}, {1}, {3}, {4}, {5}, {6}, {7, 8}, {9}}},
	} {
		var got [][]int
		for _, g := range group(batch, tt.anyKey) {
			var idx []int
			for _, p := range g.members {
				idx = append(idx, slices.Index(batch, p))
			}
			got = append(got, idx)
			if len(g.members) > 1 && g.parts > 0 {
				if a := g.cmd.Args(); a[2] != g.parts*len(g.members) || a[argKeys+a[2].(int)] != "alls" {
					t.Errorf("anyKey %v: shared call %q is not an \"alls\" of %d parts", tt.anyKey, a, g.parts)
				}
			}
		}
		if !cmp.Equal(got, tt.want) {
			t.Errorf("anyKey %v: groups %v, want %v", tt.anyKey, got, tt.want)
		}
	}
}

// TestBatchSharesMultiTakes: with batching, multi-takes queued together
// under the same limits share one script call; each is decided all or
// nothing in turn (two multi-takes of a bucket holding one token: one is
// allowed, the other denied and charges nothing), and one whose bucket
// holds a value Sluice did not write fails alone.
func TestBatchSharesMultiTakes(t *testing.T) {
	ctx := t.Context()
	direct := redistest.Client(t)
	p, via := proxied(t, nil)
	s, err := New(via, Options{Prefix: newPrefix(t, direct), Batch: 64})
	if err != nil {
		t.Fatal(err)
	}
	burst := sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Hour)}
	daily := sluice.Limit{Capacity: 20, Rate: sluice.Per(1, time.Hour)}
	both := func(key string) []sluice.Request {
		return []sluice.Request{{Policy: "burst", Key: key, Cost: 1, Limit: burst}, {Policy: "daily", Key: key, Cost: 1, Limit: daily}}
	}
	// "low" has one token left in its daily bucket; "text" holds another
	// application's value in its burst bucket.
	if _, err := s.Take(ctx, sluice.Request{Policy: "daily", Key: "low", Cost: 19, Limit: daily}); err != nil {
		t.Fatal(err)
	}
	if err := direct.Set(ctx, s.bucketKey("burst", "text"), "another app's value", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// The first take goes alone and waits 200 ms for its reply; the
	// multi-takes queue meanwhile and go in the next pipeline, in one call.
	p.SetLatency(200 * time.Millisecond)
	defer p.SetLatency(0)
	var wg sync.WaitGroup
	wg.Go(func() {
		if _, err := s.Take(ctx, sluice.Request{Policy: "burst", Key: "first", Cost: 1, Limit: burst}); err != nil {
			t.Error(err)
		}
	})
	time.Sleep(50 * time.Millisecond)
	keys := []string{"a", "low", "text", "b", "low", "a"}
	mds := make([]sluice.MultiDecision, len(keys))
	errs := make([]error, len(keys))
	for i, k := range keys {
		wg.Go(func() { mds[i], errs[i] = s.TakeAll(ctx, both(k)) })
	}
	wg.Wait()
	if sh := s.Stats().SharedTakes; sh != uint64(len(keys)-1) {
		t.Fatalf("Stats().SharedTakes = %d; want %d (the queued multi-takes in one call)", sh, len(keys)-1)
	}
	lowAllowed := 0
	for i, k := range keys {
		switch {
		case k == "text":
			if !errors.Is(errs[i], sluice.ErrMisconfigured) {
				t.Errorf("TakeAll(%q) with a foreign value = %+v, %v; want an error wrapping %v", k, mds[i], errs[i], sluice.ErrMisconfigured)
			}
		case errs[i] != nil:
			t.Errorf("TakeAll(%q) = %v", k, errs[i])
		case k == "low" && mds[i].Allowed:
			lowAllowed++
		case k == "low":
			if mds[i].Denied != 1 || !mds[i].Parts[0].Allowed {
				t.Errorf("the second TakeAll(%q) = %+v; want denied by the daily bucket", k, mds[i])
			}
		case !mds[i].Allowed:
			t.Errorf("TakeAll(%q) = %+v; want allowed", k, mds[i])
		}
	}
	if lowAllowed != 1 {
		t.Errorf("%d of the two multi-takes of a bucket with one token were allowed, want 1", lowAllowed)
	}
	for _, c := range []struct {
		policy, key string
		l           sluice.Limit
		want        int64
	}{{"burst", "a", burst, 8}, {"daily", "a", daily, 18}, {"burst", "low", burst, 9}, {"daily", "low", daily, 0}, {"burst", "b", burst, 9}, {"daily", "text", daily, 20}} {
		d, err := s.Peek(ctx, sluice.Request{Policy: c.policy, Key: c.key, Cost: 1, Limit: c.l})
		if err != nil || d.Remaining != c.want {
			t.Errorf("Peek(%q, %q) = %+v, %v; want Remaining %d", c.policy, c.key, d, err, c.want)
		}
	}
	if n, err := direct.Exists(ctx, s.bucketKey("daily", "text")).Result(); err != nil || n != 0 {
		t.Errorf("EXISTS of the failed multi-take's other bucket = %d, %v; want 0 (nothing written)", n, err)
	}
}
