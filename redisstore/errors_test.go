package redisstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestErrorsSayWhatFailed: a value Sluice did not write under one of its
// keys (another application's text, another type) is a deployment mistake,
// an error wrapping sluice.ErrMisconfigured and never sluice.ErrUnavailable,
// so that a failure policy returns it rather than deciding in the store's
// place; a server that refuses connections or serves read-only (a replica)
// is an outage, wrapping sluice.ErrUnavailable.
func TestErrorsSayWhatFailed(t *testing.T) {
	c := redistest.Client(t)
	ctx := t.Context()
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
	s := newStore(t, c, Options{Batch: 1})
	foreign := []struct {
		name string
		set  func(bucket, record string) error
		id   string
	}{
		{"text under the bucket key", func(b, _ string) error { return c.Set(ctx, b, "another app's value", 0).Err() }, ""},
		{"a hash under the bucket key", func(b, _ string) error { return c.HSet(ctx, b, "f", "v").Err() }, ""},
		{"a list under the request-ID key", func(_, r string) error { return c.RPush(ctx, r, "x").Err() }, "id"},
		{"text under the request-ID key", func(_, r string) error { return c.Set(ctx, r, "x", 0).Err() }, "id"},
	}
	for i, tt := range foreign {
		key := fmt.Sprint("k", i)
		if err := tt.set(s.bucketKey(testPolicy, key), s.recordKey(testPolicy, key, "id")); err != nil {
			t.Fatal(err)
		}
		r := sluice.Request{Policy: testPolicy, Key: key, Cost: 1, Limit: l, RequestID: tt.id}
		_, err := s.Take(ctx, r)
		if !errors.Is(err, sluice.ErrMisconfigured) || sluice.IsUnavailable(err) {
			t.Errorf("%s: Take error %v; want one wrapping %v and not %v", tt.name, err, sluice.ErrMisconfigured, sluice.ErrUnavailable)
		}
		if tt.id == "" {
			r.Cost = 1
			if _, err := s.Peek(ctx, r); !errors.Is(err, sluice.ErrMisconfigured) || sluice.IsUnavailable(err) {
				t.Errorf("%s: Peek error %v; want one wrapping %v and not %v", tt.name, err, sluice.ErrMisconfigured, sluice.ErrUnavailable)
			}
		}
	}

	// Outages: a server that is gone, and a replica that refuses writes.
	gone := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { gone.Close() })
	master := redistest.Private(t)
	replica := master.Replica(t)
	readOnly := redis.NewClient(&redis.Options{Addr: replica.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { readOnly.Close() })
	for name, c := range map[string]Client{"refused": gone, "replica": readOnly} {
		s, err := New(c, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: l}); !sluice.IsUnavailable(err) || errors.Is(err, sluice.ErrMisconfigured) {
			t.Errorf("%s: Take error %v; want one wrapping %v and not %v", name, err, sluice.ErrUnavailable, sluice.ErrMisconfigured)
		}
	}
}

// TestBatchForeignValueFailsOnlyItsOwn: with batching on a standalone
// server, takes queued together share one script call whatever their
// keys; a bucket key holding a value Sluice did not write fails the takes
// of that bucket alone, and the others in the same call are decided.
func TestBatchForeignValueFailsOnlyItsOwn(t *testing.T) {
	ctx := t.Context()
	direct := redistest.Client(t)
	p, via := proxied(t, nil)
	s, err := New(via, Options{Prefix: newPrefix(t, direct), Batch: 64})
	if err != nil {
		t.Fatal(err)
	}
	l := sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Hour)}
	if _, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "warm", Cost: 1, Limit: l}); err != nil {
		t.Fatal(err) // loads the script
	}
	if err := direct.Set(ctx, s.bucketKey(testPolicy, "text"), "another app's value", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := direct.HSet(ctx, s.bucketKey(testPolicy, "hash"), "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	// The first take goes alone and waits 200 ms for its reply; the
	// others queue meanwhile and go in the next pipeline, in one call.
	p.SetLatency(200 * time.Millisecond)
	defer p.SetLatency(0)
	var wg sync.WaitGroup
	wg.Go(func() {
		if d, err := s.Take(ctx, sluice.Request{Policy: testPolicy, Key: "first", Cost: 1, Limit: l}); err != nil || !d.Allowed {
			t.Errorf("the take in flight = %+v, %v; want allowed", d, err)
		}
	})
	time.Sleep(50 * time.Millisecond)
	keys := []string{"a", "text", "b", "hash", "c", "a"}
	errs := make([]error, len(keys))
	decisions := make([]sluice.Decision, len(keys))
	for i, k := range keys {
		wg.Go(func() {
			decisions[i], errs[i] = s.Take(ctx, sluice.Request{Policy: testPolicy, Key: k, Cost: 1, Limit: l})
		})
	}
	wg.Wait()
	if sh := s.Stats().SharedTakes; sh != uint64(len(keys)-1) {
		t.Fatalf("Stats().SharedTakes = %d; want %d (the queued takes in one call)", sh, len(keys)-1)
	}
	remaining := map[string]int64{}
	for i, k := range keys {
		switch k {
		case "text", "hash":
			if !errors.Is(errs[i], sluice.ErrMisconfigured) {
				t.Errorf("Take(%q) of a foreign value = %+v, %v; want an error wrapping %v", k, decisions[i], errs[i], sluice.ErrMisconfigured)
			}
		default:
			if errs[i] != nil || !decisions[i].Allowed {
				t.Errorf("Take(%q) batched with foreign values = %+v, %v; want allowed", k, decisions[i], errs[i])
			}
			remaining[k] += 1
		}
	}
	for k, n := range remaining {
		d, err := s.Peek(ctx, sluice.Request{Policy: testPolicy, Key: k, Cost: 1, Limit: l})
		if err != nil || d.Remaining != l.Capacity-n {
			t.Errorf("Peek(%q) = %+v, %v; want %d remaining (charged once a take)", k, d, err, l.Capacity-n)
		}
	}
}

// replyError is an error reply as go-redis returns one: it has the
// RedisError method of redis.Error.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// TestClassify: each failure of a script call wraps the sentinel that says
// what failed, and keeps its cause.
func TestClassify(t *testing.T) {
	const misconfigured, unavailable, script = "misconfigured", "unavailable", "script"
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	tests := []struct {
		err  error
		ctx  context.Context
		want string
	}{
		{replyError("ERR sluice: bucket key holds a value sluice did not write script: 0123, on @user_script:244."), nil, script},
		{replyError("WRONGTYPE Operation against a key holding the wrong kind of value script: 0123, on @user_script:126."), nil, script},
		{replyError("ERR user_script:1: Script attempted to access nonexistent global variable 'x' script: 0123, on @user_script:1."), nil, script},
		{replyError("NOAUTH Authentication required."), nil, misconfigured},
		{replyError("WRONGPASS invalid username-password pair or user is disabled."), nil, misconfigured},
		{replyError("NOPERM User u has no permissions to run the 'evalsha' command"), nil, misconfigured},
		{replyError("ERR unknown command 'evalsha', with args beginning with: "), nil, misconfigured},
		{replyError("MOVED 3999 127.0.0.1:6381"), nil, misconfigured},
		{replyError("CROSSSLOT Keys in request don't hash to the same slot"), nil, misconfigured},
		{replyError("LOADING Redis is loading the dataset in memory"), nil, unavailable},
		{replyError("READONLY You can't write against a read only replica. script: 0123, on @user_script:226."), nil, unavailable},
		{replyError("CLUSTERDOWN The cluster is down"), nil, unavailable},
		{replyError("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), nil, unavailable},
		{replyError("BUSY Redis is busy running a script."), nil, unavailable},
		{replyError("TRYAGAIN Multiple keys request during rehashing of slot"), nil, unavailable},
		{replyError("OOM command not allowed when used memory > 'maxmemory'. script: 0123, on @user_script:226."), nil, unavailable},
		{replyError("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk."), nil, unavailable},
		{replyError("NOREPLICAS Not enough good replicas to write."), nil, unavailable},
		{replyError("ERR max number of clients reached"), nil, unavailable},
		{replyError("SOMETHINGNEW the server says no"), nil, unavailable},
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, nil, unavailable},
		{io.EOF, nil, unavailable},
		{redis.ErrPoolTimeout, nil, unavailable},
		{redis.ErrClosed, nil, unavailable},
		{os.ErrDeadlineExceeded, expired, unavailable},
		{context.DeadlineExceeded, expired, unavailable},
		{scriptErrorf("reply %q is not a decision", []any{"x"}), nil, script},
	}
	for _, tt := range tests {
		ctx := tt.ctx
		if ctx == nil {
			ctx = context.Background()
		}
		err := classify(ctx, tt.err)
		var se *ScriptError
		got := map[bool]string{true: misconfigured, false: unavailable}[errors.Is(err, sluice.ErrMisconfigured)]
		if errors.As(err, &se) {
			got = script
		}
		if got != tt.want || errors.Is(err, sluice.ErrMisconfigured) == sluice.IsUnavailable(err) || !errors.Is(err, tt.err) {
			t.Errorf("classify(%v) = %v (%s); want %s, wrapping the cause and one sentinel of %v and %v", tt.err, err, got, tt.want, sluice.ErrMisconfigured, sluice.ErrUnavailable)
		}
		if tt.ctx != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("classify(%v) past the deadline = %v; want it to wrap %v", tt.err, err, context.DeadlineExceeded)
		}
	}
}
