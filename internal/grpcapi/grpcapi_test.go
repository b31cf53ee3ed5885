package grpcapi

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/sluicehq/sluice"
	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/guard"
	"github.com/sluicehq/sluice/internal/service"
)

// call is one RPC of a test, answered as a decision.
type call func(context.Context, sluicev1.RateLimiterClient) (*sluicev1.Decision, error)

func take(policy, key string, cost int64, requestID string) call {
	return func(ctx context.Context, c sluicev1.RateLimiterClient) (*sluicev1.Decision, error) {
		return c.Take(ctx, &sluicev1.TakeRequest{Policy: policy, Key: key, Cost: cost, RequestId: requestID})
	}
}

func peek(policy, key string, cost int64) call {
	return func(ctx context.Context, c sluicev1.RateLimiterClient) (*sluicev1.Decision, error) {
		return c.Peek(ctx, &sluicev1.PeekRequest{Policy: policy, Key: key, Cost: cost})
	}
}

func drain(policy, key string, cost int64) call {
	return func(ctx context.Context, c sluicev1.RateLimiterClient) (*sluicev1.Decision, error) {
		return c.Drain(ctx, &sluicev1.DrainRequest{Policy: policy, Key: key, Cost: cost})
	}
}

func refund(policy, key string, cost int64, requestID string) call {
	return func(ctx context.Context, c sluicev1.RateLimiterClient) (*sluicev1.Decision, error) {
		return c.Refund(ctx, &sluicev1.RefundRequest{Policy: policy, Key: key, Cost: cost, RequestId: requestID})
	}
}

// reset answers an empty decision when the reset was made.
func reset(policy, key string) call {
	return func(ctx context.Context, c sluicev1.RateLimiterClient) (*sluicev1.Decision, error) {
		if _, err := c.Reset(ctx, &sluicev1.ResetRequest{Policy: policy, Key: key}); err != nil {
			return nil, err
		}
		return &sluicev1.Decision{}, nil
	}
}

// TestDecisions runs every RPC in one sequence against one server: each
// step's decision depends on the steps before it.
func TestDecisions(t *testing.T) {
	ts := start(t, newFaultStore(t, nil, false), Options{})
	api, once, shadow := lim(t, "2 2/m"), lim(t, "1 0/s"), lim(t, "1 1/h")
	burst, hourly, trial := lim(t, "3 1/s"), lim(t, "2 2/h"), lim(t, "5 5/h")
	steps := []struct {
		name string
		call call
		want *sluicev1.Decision
	}{
		{"take: allowed, cost 0 means 1", take("api", "k1", 0, ""),
			&sluicev1.Decision{Allowed: true, Remaining: 1, RetryAfter: dur(0), ResetAfter: dur(30 * time.Second), Policy: "api", Limit: api}},
		{"take: allowed, the last token", take("api", "k1", 1, ""),
			&sluicev1.Decision{Allowed: true, Remaining: 0, RetryAfter: dur(0), ResetAfter: dur(time.Minute), Policy: "api", Limit: api}},
		{"take: denied, with its wait", take("api", "k1", 1, ""),
			&sluicev1.Decision{Allowed: false, Remaining: 0, RetryAfter: dur(30 * time.Second), ResetAfter: dur(time.Minute), Policy: "api", Limit: api}},
		{"peek: denied, the wait of its cost", peek("api", "k1", 2),
			&sluicev1.Decision{Allowed: false, Remaining: 0, RetryAfter: dur(time.Minute), ResetAfter: dur(time.Minute), Policy: "api", Limit: api}},
		{"peek: a new key, nothing created", peek("api", "k2", 0),
			&sluicev1.Decision{Allowed: true, Remaining: 2, RetryAfter: dur(0), ResetAfter: dur(0), Policy: "api", Limit: api}},
		{"reset", reset("api", "k1"), &sluicev1.Decision{}},
		{"take: after the reset, full again", take("api", "k1", 0, ""),
			&sluicev1.Decision{Allowed: true, Remaining: 1, RetryAfter: dur(0), ResetAfter: dur(30 * time.Second), Policy: "api", Limit: api}},

		{"take: a bucket that never refills", take("once", "k1", 0, ""),
			&sluicev1.Decision{Allowed: true, Remaining: 0, RetryAfter: dur(0), ResetNever: true, Policy: "once", Limit: once}},
		{"take: denied, and waiting cannot help", take("once", "k1", 0, ""),
			&sluicev1.Decision{Allowed: false, Remaining: 0, Never: true, ResetNever: true, Policy: "once", Limit: once}},

		{"take with a request ID", take("api", "k3", 1, "order-1"),
			&sluicev1.Decision{Allowed: true, Remaining: 1, RetryAfter: dur(0), ResetAfter: dur(30 * time.Second), Policy: "api", Limit: api}},
		{"take with the request ID again: replayed", take("api", "k3", 1, "order-1"),
			&sluicev1.Decision{Allowed: true, Remaining: 1, RetryAfter: dur(0), ResetAfter: dur(30 * time.Second), Policy: "api", Limit: api, Replayed: true}},
		{"refund of the request ID", refund("api", "k3", 1, "order-1"),
			&sluicev1.Decision{Allowed: true, Remaining: 2, RetryAfter: dur(0), ResetAfter: dur(0), Policy: "api", Limit: api, Taken: -1}},
		{"refund of the request ID again: replayed, nothing given", refund("api", "k3", 1, "order-1"),
			&sluicev1.Decision{Allowed: true, Remaining: 2, RetryAfter: dur(0), ResetAfter: dur(0), Policy: "api", Limit: api, Replayed: true}},

		{"drain: more than there is", drain("api", "k4", 5),
			&sluicev1.Decision{Allowed: false, Remaining: 0, Never: true, ResetAfter: dur(time.Minute), Policy: "api", Limit: api, Taken: 2}},
		{"refund without a request ID", refund("api", "k4", 0, ""),
			&sluicev1.Decision{Allowed: true, Remaining: 1, RetryAfter: dur(0), ResetAfter: dur(30 * time.Second), Policy: "api", Limit: api, Taken: -1}},

		{"shadow: allowed", take("shadow", "k1", 0, ""),
			&sluicev1.Decision{Allowed: true, Remaining: 0, RetryAfter: dur(0), ResetAfter: dur(time.Hour), Policy: "shadow", Limit: shadow}},
		{"shadow: a denial answered as allowed", take("shadow", "k1", 0, ""),
			&sluicev1.Decision{Allowed: true, Remaining: 0, RetryAfter: dur(0), ResetAfter: dur(time.Hour), Policy: "shadow", Limit: shadow, ShadowDenied: true}},

		{"shadow, several limits: allowed", take("trial", "k1", 0, ""),
			&sluicev1.Decision{Allowed: true, Remaining: 0, RetryAfter: dur(0), ResetAfter: dur(time.Hour), Policy: "trial", Limit: shadow,
				Limits: []*sluicev1.LimitDecision{
					{Bucket: "trial", Limit: shadow, Allowed: true, Remaining: 0, RetryAfter: dur(0), ResetAfter: dur(time.Hour)},
					{Bucket: "trial/1", Limit: trial, Allowed: true, Remaining: 4, RetryAfter: dur(0), ResetAfter: dur(12 * time.Minute)},
				}}},
		{"shadow, several limits: a denial answered as allowed, the limit that denied marked", take("trial", "k1", 0, ""),
			&sluicev1.Decision{Allowed: true, Remaining: 0, RetryAfter: dur(0), ResetAfter: dur(time.Hour), Policy: "trial", Limit: shadow, ShadowDenied: true,
				Limits: []*sluicev1.LimitDecision{
					{Bucket: "trial", Limit: shadow, Allowed: false, Remaining: 0, RetryAfter: dur(time.Hour), ResetAfter: dur(time.Hour), Decided: true},
					{Bucket: "trial/1", Limit: trial, Allowed: true, Remaining: 4, RetryAfter: dur(0), ResetAfter: dur(12 * time.Minute)},
				}}},

		{"several limits: allowed, the limit with the fewest tokens", take("login", "k1", 0, ""),
			&sluicev1.Decision{Allowed: true, Remaining: 1, RetryAfter: dur(0), ResetAfter: dur(30 * time.Minute), Policy: "login", Limit: hourly,
				Limits: []*sluicev1.LimitDecision{
					{Bucket: "login", Limit: burst, Allowed: true, Remaining: 2, RetryAfter: dur(0), ResetAfter: dur(time.Second)},
					{Bucket: "login/1", Limit: hourly, Allowed: true, Remaining: 1, RetryAfter: dur(0), ResetAfter: dur(30 * time.Minute)},
				}}},
		{"several limits: allowed, the hourly limit spent", take("login", "k1", 0, ""),
			&sluicev1.Decision{Allowed: true, Remaining: 0, RetryAfter: dur(0), ResetAfter: dur(time.Hour), Policy: "login", Limit: hourly,
				Limits: []*sluicev1.LimitDecision{
					{Bucket: "login", Limit: burst, Allowed: true, Remaining: 1, RetryAfter: dur(0), ResetAfter: dur(2 * time.Second)},
					{Bucket: "login/1", Limit: hourly, Allowed: true, Remaining: 0, RetryAfter: dur(0), ResetAfter: dur(time.Hour)},
				}}},
		{"several limits: denied by the hourly limit, its wait, nothing taken", take("login", "k1", 0, ""),
			&sluicev1.Decision{Allowed: false, Remaining: 0, RetryAfter: dur(30 * time.Minute), ResetAfter: dur(time.Hour), Policy: "login", Limit: hourly,
				Limits: []*sluicev1.LimitDecision{
					{Bucket: "login", Limit: burst, Allowed: true, Remaining: 1, RetryAfter: dur(0), ResetAfter: dur(2 * time.Second)},
					{Bucket: "login/1", Limit: hourly, Allowed: false, Remaining: 0, RetryAfter: dur(30 * time.Minute), ResetAfter: dur(time.Hour), Decided: true},
				}}},
		{"several limits: peek", peek("login", "k1", 1),
			&sluicev1.Decision{Allowed: false, Remaining: 0, RetryAfter: dur(30 * time.Minute), ResetAfter: dur(time.Hour), Policy: "login", Limit: hourly,
				Limits: []*sluicev1.LimitDecision{
					{Bucket: "login", Limit: burst, Allowed: true, Remaining: 1, RetryAfter: dur(0), ResetAfter: dur(2 * time.Second)},
					{Bucket: "login/1", Limit: hourly, Allowed: false, Remaining: 0, RetryAfter: dur(30 * time.Minute), ResetAfter: dur(time.Hour), Decided: true},
				}}},
		{"several limits: drain, each limit as far as it can", drain("login", "k2", 3),
			&sluicev1.Decision{Allowed: false, Remaining: 0, Never: true, ResetAfter: dur(time.Hour), Policy: "login", Limit: hourly, Taken: 2,
				Limits: []*sluicev1.LimitDecision{
					{Bucket: "login", Limit: burst, Allowed: true, Remaining: 0, RetryAfter: dur(0), ResetAfter: dur(3 * time.Second), Taken: 3},
					{Bucket: "login/1", Limit: hourly, Allowed: false, Remaining: 0, Never: true, ResetAfter: dur(time.Hour), Taken: 2, Decided: true},
				}}},
		{"several limits: reset", reset("login", "k1"), &sluicev1.Decision{}},
		{"several limits: full again after the reset", peek("login", "k1", 2),
			&sluicev1.Decision{Allowed: true, Remaining: 2, RetryAfter: dur(0), ResetAfter: dur(0), Policy: "login", Limit: hourly,
				Limits: []*sluicev1.LimitDecision{
					{Bucket: "login", Limit: burst, Allowed: true, Remaining: 3, RetryAfter: dur(0), ResetAfter: dur(0)},
					{Bucket: "login/1", Limit: hourly, Allowed: true, Remaining: 2, RetryAfter: dur(0), ResetAfter: dur(0)},
				}}},
	}
	for _, s := range steps {
		got, err := s.call(callCtx(t, false), ts.client)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if diff := cmp.Diff(s.want, got, protocmp.Transform()); diff != "" {
			t.Errorf("%s: decision (-want +got):\n%s", s.name, diff)
		}
	}
}

// TestErrors checks the status of every kind of error, with the detail
// that names what was wrong, and that only the deployment's faults are
// logged, without the key.
func TestErrors(t *testing.T) {
	const secretKey = "k-misconfigured-7f3a"
	store := newFaultStore(t, map[string]error{
		secretKey:    fmt.Errorf("test store: schema missing: %w", sluice.ErrMisconfigured),
		"k-canceled": fmt.Errorf("test store: %w", context.Canceled),
		"k-deadline": fmt.Errorf("test store: %w", context.DeadlineExceeded),
		"k-too-many": fmt.Errorf("test store: %w", sluice.ErrTooManyKeys),
		"k-down":     fmt.Errorf("test store: connection refused: %w", sluice.ErrUnavailable),
	}, false)
	ts := start(t, store, Options{})
	long := strings.Repeat("x", sluice.MaxKeyLen+1)
	invalid := func(field string) errSummary { return errSummary{Code: codes.InvalidArgument, Field: field} }
	tests := []struct {
		name  string
		setup call // made first, must succeed
		call  call
		want  errSummary
	}{
		{name: "take: no policy", call: take("", "k", 1, ""), want: invalid("policy")},
		{name: "take: no key", call: take("api", "", 1, ""), want: invalid("key")},
		{name: "take: a key too long", call: take("api", long, 1, ""), want: invalid("key")},
		{name: "take: a negative cost", call: take("api", "k", -1, ""), want: invalid("cost")},
		{name: "take: a cost over the capacity", call: take("api", "k", 3, ""), want: invalid("cost")},
		{name: "take: a request ID too long", call: take("api", "k", 1, long), want: invalid("request_id")},
		{name: "take: a request ID for several limits", call: take("login", "k", 1, "r"), want: invalid("request_id")},
		{name: "take: unknown policy", call: take("nope", "k", 1, ""),
			want: errSummary{Code: codes.NotFound, Resource: "sluice.v1.Policy nope"}},
		{name: "take: a request ID with another cost", setup: take("api", "k-conflict", 1, "r1"), call: take("api", "k-conflict", 2, "r1"),
			want: errSummary{Code: codes.FailedPrecondition, Precondition: "REQUEST_ID_CONFLICT request_id"}},
		{name: "peek: no key", call: peek("api", "", 1), want: invalid("key")},
		{name: "peek: unknown policy", call: peek("nope", "k", 1),
			want: errSummary{Code: codes.NotFound, Resource: "sluice.v1.Policy nope"}},
		{name: "drain: a negative cost", call: drain("api", "k", -5), want: invalid("cost")},
		{name: "drain: no policy", call: drain("", "k", 1), want: invalid("policy")},
		{name: "refund: an unknown request ID", call: refund("api", "k", 1, "never-taken"),
			want: errSummary{Code: codes.FailedPrecondition, Precondition: "UNKNOWN_REQUEST_ID request_id"}},
		{name: "refund: a request ID for several limits", call: refund("login", "k", 1, "r"), want: invalid("request_id")},
		{name: "reset: no key", call: reset("api", ""), want: invalid("key")},
		{name: "reset: a key too long", call: reset("api", long), want: invalid("key")},
		{name: "reset: unknown policy", call: reset("nope", "k"),
			want: errSummary{Code: codes.NotFound, Resource: "sluice.v1.Policy nope"}},
		{name: "take: the store unavailable", call: take("api", "k-down", 1, ""), want: errSummary{Code: codes.Unavailable}},
		{name: "reset: the store unavailable", call: reset("api", "k-down"), want: errSummary{Code: codes.Unavailable}},
		{name: "take: the store refuses new keys", call: take("api", "k-too-many", 1, ""), want: errSummary{Code: codes.Unavailable}},
		{name: "take: canceled", call: take("api", "k-canceled", 1, ""), want: errSummary{Code: codes.Canceled}},
		{name: "take: deadline exceeded", call: take("api", "k-deadline", 1, ""), want: errSummary{Code: codes.DeadlineExceeded}},
		{name: "take: the store misconfigured", call: take("api", secretKey, 1, ""), want: errSummary{Code: codes.Internal}},
		{name: "drain: the store misconfigured", call: drain("login", secretKey, 1), want: errSummary{Code: codes.Internal}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.setup != nil {
				if _, err := tt.setup(callCtx(t, false), ts.client); err != nil {
					t.Fatalf("setup: %v", err)
				}
			}
			d, err := tt.call(callCtx(t, false), ts.client)
			if err == nil {
				t.Fatalf("got decision %v, want an error", d)
			}
			if diff := cmp.Diff(tt.want, errorOf(t, err)); diff != "" {
				t.Errorf("status of %v (-want +got):\n%s", err, diff)
			}
		})
	}
	logs := ts.log.String()
	for _, want := range []string{"level=ERROR", "level=WARN", "/sluice.v1.RateLimiter/Take", "/sluice.v1.RateLimiter/Drain", sluice.ErrMisconfigured.Error()} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, secretKey) {
		t.Errorf("log names the key %q:\n%s", secretKey, logs)
	}
	// Only the store's faults are logged: 2 Internal, 3 Unavailable.
	if n := strings.Count(logs, "decision failed"); n != 5 {
		t.Errorf("log has %d lines of failed decisions, want 5:\n%s", n, logs)
	}
}

// TestBatch checks that a batch answers each request as Take would, in
// order, a bad request failing only its own result.
func TestBatch(t *testing.T) {
	ts := start(t, newFaultStore(t, nil, false), Options{MaxBatch: 7})
	api := lim(t, "2 2/m")
	ctx := callCtx(t, false)
	got, err := ts.client.TakeBatch(ctx, &sluicev1.TakeBatchRequest{Requests: []*sluicev1.TakeRequest{
		{Policy: "api", Key: "b1"},
		{Policy: "api", Key: ""},
		{Policy: "nope", Key: "b1"},
		{Policy: "api", Key: "b1", Cost: -2},
		{Policy: "api", Key: "b1", Cost: 1, RequestId: "same"},
		{Policy: "api", Key: "b1", Cost: 2, RequestId: "same"},
		{Policy: "api", Key: "b1", Cost: 1},
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := []any{
		&sluicev1.Decision{Allowed: true, Remaining: 1, RetryAfter: dur(0), ResetAfter: dur(30 * time.Second), Policy: "api", Limit: api},
		errSummary{Code: codes.InvalidArgument, Field: "requests[1].key"},
		errSummary{Code: codes.NotFound, Resource: "sluice.v1.Policy nope"},
		errSummary{Code: codes.InvalidArgument, Field: "requests[3].cost"},
		&sluicev1.Decision{Allowed: true, Remaining: 0, RetryAfter: dur(0), ResetAfter: dur(time.Minute), Policy: "api", Limit: api},
		errSummary{Code: codes.FailedPrecondition, Precondition: "REQUEST_ID_CONFLICT requests[5].request_id"},
		&sluicev1.Decision{Allowed: false, Remaining: 0, RetryAfter: dur(30 * time.Second), ResetAfter: dur(time.Minute), Policy: "api", Limit: api},
	}
	checkBatch(t, got, want)

	// The whole call fails only for a bad batch.
	for _, n := range []int{0, 8} {
		reqs := make([]*sluicev1.TakeRequest, n)
		for i := range reqs {
			reqs[i] = &sluicev1.TakeRequest{Policy: "api", Key: "b2"}
		}
		_, err := ts.client.TakeBatch(ctx, &sluicev1.TakeBatchRequest{Requests: reqs})
		if diff := cmp.Diff(errSummary{Code: codes.InvalidArgument, Field: "requests"}, errorOf(t, err)); diff != "" {
			t.Errorf("batch of %d: status of %v (-want +got):\n%s", n, err, diff)
		}
	}
}

// checkBatch compares the results of a batch with want: a *Decision or
// the errSummary of an error, for each.
func checkBatch(t *testing.T, got *sluicev1.TakeBatchResponse, want []any) {
	t.Helper()
	if len(got.GetResults()) != len(want) {
		t.Fatalf("batch answered %d results, want %d: %v", len(got.GetResults()), len(want), got)
	}
	for i, r := range got.GetResults() {
		switch w := want[i].(type) {
		case *sluicev1.Decision:
			if diff := cmp.Diff(w, r.GetDecision(), protocmp.Transform()); diff != "" {
				t.Errorf("result %d (-want +got):\n%s", i, diff)
			}
		case errSummary:
			if r.GetError() == nil {
				t.Errorf("result %d is %v, want an error", i, r)
				continue
			}
			if diff := cmp.Diff(w, summarize(t, status.FromProto(r.GetError()))); diff != "" {
				t.Errorf("result %d: status %v (-want +got):\n%s", i, r.GetError(), diff)
			}
		}
	}
}

// TestBatchCallEnded checks that a batch whose call has ended fails as a
// whole, with the context's code, rather than item by item.
func TestBatchCallEnded(t *testing.T) {
	store := newFaultStore(t, nil, false)
	table, err := service.NewTable(store, "test", testPolicies)
	if err != nil {
		t.Fatal(err)
	}
	core, err := service.New(store, table, service.Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(core, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = s.TakeBatch(ctx, &sluicev1.TakeBatchRequest{Requests: []*sluicev1.TakeRequest{{Policy: "api", Key: "k"}}})
	if got := status.Code(err); got != codes.Canceled {
		t.Errorf("batch of an ended call: %v, want code %v", err, codes.Canceled)
	}
}

// TestDegraded checks the answers while the store cannot be reached,
// behind guard: a fail-closed denial is UNAVAILABLE with the failure
// mode's wait, never a quota denial, in a batch too; what no failure mode
// can decide is UNAVAILABLE; a fail-open decision is an allowed one,
// marked degraded.
func TestDegraded(t *testing.T) {
	const probe = 2 * time.Second
	closed, err := guard.New(newFaultStore(t, nil, true), guard.Options{FailureMode: guard.FailClosed, ProbeInterval: probe, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	ts := start(t, closed, Options{})
	denial := func(policy string) errSummary {
		return errSummary{Code: codes.Unavailable, Reason: "sluice DEGRADED_DENIAL " + policy, RetryDelay: probe}
	}
	tests := []struct {
		name string
		call call
		want errSummary
	}{
		{"take", take("api", "k", 1, ""), denial("api")},
		{"take with a request ID", take("api", "k", 1, "r"), denial("api")},
		{"peek", peek("api", "k", 1), denial("api")},
		{"drain", drain("api", "k", 1), denial("api")},
		{"take of several limits", take("login", "k", 1, ""), denial("login")},
		{"refund: nothing can give back in the store's place", refund("api", "k", 1, ""), errSummary{Code: codes.Unavailable}},
		{"reset: nothing can reset in the store's place", reset("api", "k"), errSummary{Code: codes.Unavailable}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := tt.call(callCtx(t, false), ts.client)
			if err == nil {
				t.Fatalf("got decision %v, want an error", d)
			}
			if diff := cmp.Diff(tt.want, errorOf(t, err)); diff != "" {
				t.Errorf("status of %v (-want +got):\n%s", err, diff)
			}
		})
	}

	t.Run("shadow policy: the denial is allowed", func(t *testing.T) {
		d, err := take("shadow", "k", 1, "")(callCtx(t, false), ts.client)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed || !d.Degraded || !d.ShadowDenied {
			t.Errorf("got %v, want allowed, degraded and shadow_denied", d)
		}
	})

	t.Run("batch", func(t *testing.T) {
		got, err := ts.client.TakeBatch(callCtx(t, false), &sluicev1.TakeBatchRequest{Requests: []*sluicev1.TakeRequest{
			{Policy: "api", Key: "k"},
			{Policy: "nope", Key: "k"},
			{Policy: "login", Key: "k"},
		}})
		if err != nil {
			t.Fatal(err)
		}
		checkBatch(t, got, []any{denial("api"), errSummary{Code: codes.NotFound, Resource: "sluice.v1.Policy nope"}, denial("login")})
	})

	t.Run("fail open: allowed, degraded", func(t *testing.T) {
		open, err := guard.New(newFaultStore(t, nil, true), guard.Options{FailureMode: guard.FailOpen, Now: func() time.Time { return now }})
		if err != nil {
			t.Fatal(err)
		}
		ts := start(t, open, Options{})
		d, err := take("api", "k", 1, "")(callCtx(t, false), ts.client)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed || !d.Degraded || d.Policy != "api" {
			t.Errorf("got %v, want an allowed, degraded decision of api", d)
		}
	})
}

// TestAuth checks the bearer tokens: every method of the server needs one,
// unary or streaming, except the health and reflection services.
func TestAuth(t *testing.T) {
	ts := start(t, newFaultStore(t, nil, false), Options{Tokens: []string{"another-token", testToken}})
	withAuth := func(t *testing.T, value string) context.Context {
		ctx := callCtx(t, false)
		if value != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", value)
		}
		return ctx
	}
	tests := []struct {
		name          string
		authorization string
		want          codes.Code
	}{
		{"no token", "", codes.Unauthenticated},
		{"wrong token", "Bearer wrong", codes.Unauthenticated},
		{"a prefix of the token", "Bearer " + testToken[:len(testToken)-1], codes.Unauthenticated},
		{"the token with more", "Bearer " + testToken + "x", codes.Unauthenticated},
		{"not a bearer token", "Basic " + testToken, codes.Unauthenticated},
		{"lower-case scheme", "bearer " + testToken, codes.Unauthenticated},
		{"empty bearer token", "Bearer ", codes.Unauthenticated},
		{"the token", "Bearer " + testToken, codes.OK},
		{"the other token", "Bearer another-token", codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ts.client.Take(withAuth(t, tt.authorization), &sluicev1.TakeRequest{Policy: "api", Key: "auth"})
			if got := status.Code(err); got != tt.want {
				t.Errorf("Take: %v, want code %v", err, tt.want)
			}
			_, err = ts.client.TakeBatch(withAuth(t, tt.authorization), &sluicev1.TakeBatchRequest{Requests: []*sluicev1.TakeRequest{{Policy: "api", Key: "auth"}}})
			if got := status.Code(err); got != tt.want {
				t.Errorf("TakeBatch: %v, want code %v", err, tt.want)
			}
			stream, err := ts.conn.NewStream(withAuth(t, tt.authorization), &streamService.Streams[0], "/test.Stream/Get")
			if err == nil {
				if err = stream.CloseSend(); err == nil {
					err = stream.RecvMsg(&healthpb.HealthCheckResponse{})
				}
			}
			if got := status.Code(err); got != tt.want {
				t.Errorf("a streaming method: %v, want code %v", err, tt.want)
			}
		})
	}

	if logs := ts.log.String(); strings.Contains(logs, testToken) {
		t.Errorf("log names the token:\n%s", logs)
	}

	t.Run("health needs no token", func(t *testing.T) {
		h := healthpb.NewHealthClient(ts.conn)
		res, err := h.Check(callCtx(t, false), &healthpb.HealthCheckRequest{})
		if err != nil || res.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("Check: %v, %v; want SERVING", res, err)
		}
		w, err := h.Watch(callCtx(t, false), &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = w.Recv()
		}
		if err != nil {
			t.Errorf("Watch: %v", err)
		}
	})

	t.Run("reflection needs no token", func(t *testing.T) {
		r, err := reflectionpb.NewServerReflectionClient(ts.conn).ServerReflectionInfo(callCtx(t, false))
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
			t.Fatal(err)
		}
		res, err := r.Recv()
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, s := range res.GetListServicesResponse().GetService() {
			names = append(names, s.GetName())
		}
		if !strings.Contains(strings.Join(names, " "), "sluice.v1.RateLimiter") {
			t.Errorf("reflection lists %v, want sluice.v1.RateLimiter among them", names)
		}
	})
}

// TestPublic checks that only the health and reflection services are
// public, by the full method name.
func TestPublic(t *testing.T) {
	tests := []struct {
		method string
		want   bool
	}{
		{"/grpc.health.v1.Health/Check", true},
		{"/grpc.health.v1.Health/Watch", true},
		{"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", true},
		{"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", true},
		{"/sluice.v1.RateLimiter/Take", false},
		{"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", false},
		{"/grpc.health.v1.HealthX/Check", false},
		{"/x.grpc.health.v1.Health/Check", false},
		{"grpc.health.v1.Health/Check", false},
		{"/grpc.health.v1.Health", false},
		{"", false},
	}
	for _, tt := range tests {
		if got := public(tt.method); got != tt.want {
			t.Errorf("public(%q) = %v, want %v", tt.method, got, tt.want)
		}
	}
}

// TestWithoutTokens checks that a server without tokens asks for none.
func TestWithoutTokens(t *testing.T) {
	ts := start(t, newFaultStore(t, nil, false), Options{})
	ctx := metadata.AppendToOutgoingContext(callCtx(t, false), "authorization", "Bearer anything")
	for _, ctx := range []context.Context{callCtx(t, false), ctx} {
		if _, err := ts.client.Take(ctx, &sluicev1.TakeRequest{Policy: "api", Key: "k"}); err != nil {
			t.Errorf("Take: %v", err)
		}
	}
}

func TestNew(t *testing.T) {
	store := newFaultStore(t, nil, false)
	table, err := service.NewTable(store, "test", testPolicies)
	if err != nil {
		t.Fatal(err)
	}
	core, err := service.New(store, table, service.Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		core *service.Core
		o    Options
	}{
		{"nil core", nil, Options{}},
		{"negative MaxBatch", core, Options{MaxBatch: -1}},
		{"an empty token", core, Options{Tokens: []string{"t", ""}}},
	}
	for _, tt := range tests {
		if _, err := New(tt.core, tt.o); !errors.Is(err, sluice.ErrInvalidOption) {
			t.Errorf("%s: New: %v, want an error wrapping ErrInvalidOption", tt.name, err)
		}
	}
	s, err := New(core, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if s.maxBatch != DefaultMaxBatch || DefaultMaxBatch != 1000 {
		t.Errorf("default MaxBatch %d, DefaultMaxBatch %d; want 1000", s.maxBatch, DefaultMaxBatch)
	}
}

func TestLimit(t *testing.T) {
	tests := []struct {
		in   sluice.Limit
		want *sluicev1.Limit
	}{
		{sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(10)},
			&sluicev1.Limit{Capacity: 100, RefillTokens: 10, RefillPeriod: dur(time.Second), Text: "100 10/s"}},
		{sluice.Limit{Capacity: 7, Rate: sluice.Per(3, 1500*time.Millisecond)},
			&sluicev1.Limit{Capacity: 7, RefillTokens: 3, RefillPeriod: dur(1500 * time.Millisecond), Text: "7 3/1.5s"}},
		{sluice.Limit{Capacity: 1000, Rate: sluice.Per(0, time.Second)},
			&sluicev1.Limit{Capacity: 1000, RefillTokens: 0, RefillPeriod: dur(time.Second), Text: "1000 0/s"}},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, limit(tt.in), protocmp.Transform()); diff != "" {
			t.Errorf("limit(%v) (-want +got):\n%s", tt.in, diff)
		}
	}
}
