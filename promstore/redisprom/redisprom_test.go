package redisprom_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/promstore"
	"github.com/sluicehq/sluice/promstore/internal/promtest"
	"github.com/sluicehq/sluice/promstore/redisprom"
	"github.com/sluicehq/sluice/redisstore"
)

var limit = sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Hour)}

// newRedisstore returns a redisstore.Store on the test server with a key
// prefix of its own, whose keys are deleted when t ends.
func newRedisstore(t *testing.T, c *redis.Client) (*redisstore.Store, string) {
	t.Helper()
	var b [6]byte
	rand.Read(b[:])
	prefix := "sluicetest:redisprom:" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Unlink(ctx, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Errorf("deleting the keys of %q: %v", prefix, err)
		}
	})
	s, err := redisstore.New(c, redisstore.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return s, prefix
}

// TestScriptLoads counts script loads on a real Redis: none for a new
// store, exactly one for a take after SCRIPT FLUSH.
func TestScriptLoads(t *testing.T) {
	c := redistest.Client(t)
	rs, _ := newRedisstore(t, c)
	reg := prometheus.NewRegistry()
	if err := redisprom.Register(reg, promstore.Options{ConstLabels: prometheus.Labels{"store": "redis"}}, rs.Stats); err != nil {
		t.Fatal(err)
	}
	want := func(n int) string {
		return fmt.Sprintf(`
# HELP sluice_redisstore_script_loads_total Times a Redis server did not have the decision script cached (first use, restart, failover, SCRIPT FLUSH) and the store sent it in full with EVAL.
# TYPE sluice_redisstore_script_loads_total counter
sluice_redisstore_script_loads_total{store="redis"} %d
`, n)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(0)), "sluice_redisstore_script_loads_total"); err != nil {
		t.Errorf("a new store: %v", err)
	}
	if err := c.ScriptFlush(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.Take(t.Context(), sluice.Request{Policy: "p", Key: "k", Cost: 1, Limit: limit}); err != nil {
		t.Fatalf("Take after SCRIPT FLUSH: %v", err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(1)), "sluice_redisstore_script_loads_total"); err != nil {
		t.Errorf("after SCRIPT FLUSH and a take: %v", err)
	}
}

// TestConversions counts the takes that converted a bucket stored under
// another limit of the same policy.
func TestConversions(t *testing.T) {
	c := redistest.Client(t)
	rs, _ := newRedisstore(t, c)
	reg := prometheus.NewRegistry()
	if err := redisprom.Register(reg, promstore.Options{}, rs.Stats); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	other := sluice.Limit{Capacity: limit.Capacity + 1, Rate: limit.Rate}
	for _, l := range []sluice.Limit{limit, limit, other, limit} {
		if _, err := rs.Take(ctx, sluice.Request{Policy: "p", Key: "k", Cost: 1, Limit: l}); err != nil {
			t.Fatal(err)
		}
	}
	if got := promtest.Value(t, reg, "sluice_redisstore_conversions_total", nil); got != 2 {
		t.Errorf("sluice_redisstore_conversions_total = %v, want 2 (two changes of limit)", got)
	}
}

// TestNamespace: Options.Namespace starts the name; the other options do
// not matter.
func TestNamespace(t *testing.T) {
	reg := prometheus.NewRegistry()
	stats := func() redisstore.Stats { return redisstore.Stats{ScriptLoads: 3} }
	if err := redisprom.Register(reg, promstore.Options{Namespace: "app", DurationBuckets: []float64{1}}, stats); err != nil {
		t.Fatal(err)
	}
	if got := promtest.Value(t, reg, "app_redisstore_script_loads_total", nil); got != 3 {
		t.Errorf("app_redisstore_script_loads_total = %v, want 3", got)
	}
}

// TestScriptErrorKind: a take that makes the script fail on a foreign value
// at the bucket's key is a deployment mistake, counted by promstore.New as
// an error of kind "misconfigured", not as an outage.
func TestScriptErrorKind(t *testing.T) {
	c := redistest.Client(t)
	rs, prefix := newRedisstore(t, c)
	reg := prometheus.NewRegistry()
	s, err := promstore.New(rs, reg, promstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := s.Take(ctx, sluice.Request{Policy: "p", Key: "k", Cost: 1, Limit: limit}); err != nil {
		t.Fatal(err)
	}
	keys, err := c.Keys(ctx, prefix+"*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys of the store after one take: %q, %v; want the bucket's alone", keys, err)
	}
	if err := c.Del(ctx, keys[0]).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.RPush(ctx, keys[0], "foreign").Err(); err != nil {
		t.Fatal(err)
	}
	_, err = s.Take(ctx, sluice.Request{Policy: "p", Key: "k", Cost: 1, Limit: limit})
	if got := promstore.Kind(err); got != promstore.KindMisconfigured {
		t.Errorf("Kind(%v) = %q, want %q", err, got, promstore.KindMisconfigured)
	}
	for _, tt := range []struct {
		kind string
		want float64
	}{
		{promstore.KindMisconfigured, 1},
		{promstore.KindScript, 0},
		{promstore.KindServer, 0},
		{promstore.KindUnavailable, 0},
		{promstore.KindOther, 0},
	} {
		if got := promtest.Value(t, reg, "sluice_errors_total", map[string]string{"op": "take", "kind": tt.kind}); got != tt.want {
			t.Errorf("sluice_errors_total{op=take,kind=%s} = %v, want %v", tt.kind, got, tt.want)
		}
	}
}

// TestRegisterErrors: no nil registerer or stats, no partial or double
// registration, distinct constant labels share a registry.
func TestRegisterErrors(t *testing.T) {
	stats := func() redisstore.Stats { return redisstore.Stats{} }
	if err := redisprom.Register(nil, promstore.Options{}, stats); err == nil {
		t.Error("Register with a nil registerer succeeded, want an error")
	}
	if err := redisprom.Register(prometheus.NewRegistry(), promstore.Options{}, nil); err == nil {
		t.Error("Register with nil stats succeeded, want an error")
	}
	reg := prometheus.NewRegistry()
	if err := redisprom.Register(reg, promstore.Options{}, stats); err != nil {
		t.Fatal(err)
	}
	var already prometheus.AlreadyRegisteredError
	if err := redisprom.Register(reg, promstore.Options{}, stats); !errors.As(err, &already) {
		t.Errorf("second Register on one registry: %v, want prometheus.AlreadyRegisteredError", err)
	}
	reg = prometheus.NewRegistry()
	for _, name := range []string{"a", "b"} {
		if err := redisprom.Register(reg, promstore.Options{ConstLabels: prometheus.Labels{"store": name}}, stats); err != nil {
			t.Errorf("Register with store=%q: %v", name, err)
		}
	}
}

// TestMultiTakeStats exports the counters of multi-takes across Cluster
// slots.
func TestMultiTakeStats(t *testing.T) {
	reg := prometheus.NewRegistry()
	stats := func() redisstore.Stats { return redisstore.Stats{CrossSlotTakes: 7, LostRefunds: 2} }
	if err := redisprom.Register(reg, promstore.Options{}, stats); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]float64{
		"sluice_redisstore_cross_slot_takes_total": 7,
		"sluice_redisstore_lost_refunds_total":     2,
	} {
		if got := promtest.Value(t, reg, name, nil); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
}

// TestOperations: promstore in front of a real redisstore is a
// sluice.Operator that forwards every operation and counts it.
func TestOperations(t *testing.T) {
	c := redistest.Client(t)
	rs, _ := newRedisstore(t, c)
	reg := prometheus.NewRegistry()
	s, err := promstore.New(rs, reg, promstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	promtest.Operations(t, s, reg, limit)
}
