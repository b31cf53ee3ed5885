package grpclimit_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/sluicetest"
)

var (
	burstLimit = sluice.Limit{Capacity: 5, Rate: sluice.PerSecond(1)}
	dailyLimit = sluice.Limit{Capacity: 3, Rate: sluice.Per(3, 24*time.Hour)} // a token every 8 hours
)

// reply is what a client saw of one unary Check.
type reply struct {
	code     codes.Code
	header   metadata.MD
	trailer  metadata.MD
	retry    time.Duration // RetryInfo's delay; -1 for none
	violated []string      // QuotaFailure's quota IDs
}

func check(client healthpb.HealthClient, ctx context.Context) reply {
	var r reply
	_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&r.header), grpc.Trailer(&r.trailer))
	r.code = status.Code(err)
	ri, qf := details(err)
	r.retry = -1
	if ri != nil {
		r.retry = ri.GetRetryDelay().AsDuration()
	}
	for _, v := range qf.GetViolations() {
		r.violated = append(r.violated, v.GetQuotaId())
	}
	return r
}

func first(md metadata.MD, key string) string {
	if vs := md.Get(key); len(vs) > 0 {
		return vs[0]
	}
	return "<absent>"
}

// A burst limit and a daily quota decided together: a call the daily
// quota denies takes nothing from the burst bucket, its wait and its
// pushback are the daily quota's, and allowed calls carry both in their
// header metadata.
func TestSeveralLimits(t *testing.T) {
	clock := sluicetest.NewClock(start)
	store := newMem(t, memstore.Options{Now: clock.Now, SweepInterval: -1})
	in, err := grpclimit.New(store, grpclimit.Options{
		Key: grpclimit.MetadataKey("x-api-key"),
		Limits: []grpclimit.Limit{
			{Policy: "burst", Limit: burstLimit},
			{Policy: "daily", Limit: dailyLimit},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	client, reached := server(t, in)
	policy := `"burst";q=5;w=5, "daily";q=3;w=86400`
	for i, want := range []string{
		`"burst";r=4;t=1, "daily";r=2;t=28800`,
		`"burst";r=3;t=1, "daily";r=1;t=28800`,
		`"burst";r=2;t=1, "daily";r=0;t=28800`,
	} {
		r := check(client, withKey("a"))
		if r.code != codes.OK || first(r.header, "ratelimit-policy") != policy || first(r.header, "ratelimit") != want {
			t.Errorf("call %d: %v, ratelimit-policy %q, ratelimit %q; want OK, %q, %q", i, r.code,
				first(r.header, "ratelimit-policy"), first(r.header, "ratelimit"), policy, want)
		}
		if got := first(r.trailer, "grpc-retry-pushback-ms"); got != "<absent>" {
			t.Errorf("call %d: allowed, with a pushback of %s", i, got)
		}
	}
	for i := range 4 {
		clock.Advance(time.Second)
		r := check(client, withKey("a"))
		wait := 8*time.Hour - time.Duration(i+1)*time.Second
		if r.code != codes.ResourceExhausted || r.retry != wait || fmt.Sprint(r.violated) != "[daily]" {
			t.Errorf("denial %d: %v, retry %v, violations %v; want ResourceExhausted, %v, [daily]", i, r.code, r.retry, r.violated, wait)
		}
		if got, want := first(r.trailer, "grpc-retry-pushback-ms"), fmt.Sprint(wait.Milliseconds()); got != want {
			t.Errorf("denial %d: pushback %s ms, want %s", i, got, want)
		}
		if got, want := first(r.trailer, "ratelimit"), fmt.Sprintf(`"burst";r=%d;t=1, "daily";r=0;t=%d`, min(3+i, 5), int64(wait/time.Second)); got != want {
			t.Errorf("denial %d: ratelimit %q, want %q", i, got, want)
		}
	}
	if got := reached.Load(); got != 3 {
		t.Errorf("service reached %d times, want 3", got)
	}
	p, err := store.Peek(context.Background(), sluice.Request{Policy: "burst", Key: "x-api-key:a", Cost: 1, Limit: burstLimit})
	if err != nil {
		t.Fatal(err)
	}
	if p.Remaining != burstLimit.Capacity {
		t.Errorf("burst bucket: %d remaining, want %d (nothing charged by the denials)", p.Remaining, burstLimit.Capacity)
	}
}

// gRPC's own retry policy, configured to retry ResourceExhausted with a
// 10ms backoff, waits for the pushback instead: the retry comes when the
// bucket has a token again, and the call succeeds. (Real time: the bucket
// refills every 200ms.)
func TestRetryPushbackWithGRPCRetries(t *testing.T) {
	mem := newMem(t, memstore.Options{SweepInterval: -1})
	in, err := grpclimit.New(mem, grpclimit.Options{
		Policy: "api",
		Key:    grpclimit.MetadataKey("x-api-key"),
		Limit:  sluice.Limit{Capacity: 1, Rate: sluice.Every(200 * time.Millisecond)},
	})
	if err != nil {
		t.Fatal(err)
	}
	var attempts atomic.Int64
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		attempts.Add(1)
		return h(ctx, req)
	}, in.Unary()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	var wg sync.WaitGroup
	wg.Go(func() { srv.Serve(lis) }) //nolint:errcheck // returns when stopped
	defer func() { srv.Stop(); wg.Wait() }()
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"methodConfig": [{
			"name": [{"service": "grpc.health.v1.Health"}],
			"retryPolicy": {"maxAttempts": 2, "initialBackoff": "0.01s", "maxBackoff": "0.01s",
				"backoffMultiplier": 1, "retryableStatusCodes": ["RESOURCE_EXHAUSTED"]}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(withKey("a"), 10*time.Second)
	defer cancel()
	if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("first call: %v", err)
	}
	began := time.Now()
	if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("second call: %v, want it allowed on the retry the pushback delayed", err)
	}
	if got := attempts.Load(); got != 3 {
		t.Errorf("%d attempts reached the server, want 3 (one, then a denial and its retry)", got)
	}
	if took := time.Since(began); took < 100*time.Millisecond {
		t.Errorf("the retry came after %v, before the bucket could refill", took)
	}
}

func TestPushbackAndCodes(t *testing.T) {
	never := sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(0)}
	minute := sluice.Limit{Capacity: 1, Rate: sluice.Every(time.Minute)}
	tests := []struct {
		name     string
		opts     grpclimit.Options
		wrap     func(sluice.Store) sluice.Store
		code     codes.Code
		pushback string
		header   string // the ratelimit metadata of the denial
		before   int    // calls allowed before it
	}{
		{name: "waiting will not help: do not retry", opts: grpclimit.Options{Policy: "api", Limit: never},
			code: codes.ResourceExhausted, pushback: "-1", header: `"api";r=0`, before: 1},
		{name: "quota code", opts: grpclimit.Options{Policy: "api", Limit: minute, QuotaCode: codes.Unavailable},
			code: codes.Unavailable, pushback: "60000", header: `"api";r=0;t=60`, before: 1},
		{name: "degraded with a wait", opts: grpclimit.Options{Policy: "api", Limit: minute}, wrap: func(s sluice.Store) sluice.Store { return degraded{Store: s} },
			code: codes.Unavailable, pushback: "60000", header: "<absent>", before: 1},
		{name: "degraded code", opts: grpclimit.Options{Policy: "api", Limit: minute, DegradedCode: codes.Aborted}, wrap: func(s sluice.Store) sluice.Store { return degraded{Store: s} },
			code: codes.Aborted, pushback: "60000", header: "<absent>", before: 1},
		{name: "degraded without a wait: the client's own backoff", opts: grpclimit.Options{Policy: "api", Limit: minute},
			wrap: func(s sluice.Store) sluice.Store {
				return degraded{Store: s, decision: &sluice.Decision{RetryAfter: sluice.Never, Degraded: true}}
			},
			code: codes.Unavailable, pushback: "<absent>", header: "<absent>"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var store sluice.Store = newMem(t, memstore.Options{Now: sluicetest.NewClock(start).Now, SweepInterval: -1})
			if tt.wrap != nil {
				store = tt.wrap(store)
			}
			tt.opts.Key = grpclimit.MetadataKey("x-api-key")
			in, err := grpclimit.New(store, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			client, _ := server(t, in)
			for i := range tt.before {
				if r := check(client, withKey("a")); r.code != codes.OK {
					t.Fatalf("call %d: %v, want OK", i, r.code)
				}
			}
			r := check(client, withKey("a"))
			if len(r.header) > 0 {
				t.Errorf("denial with header metadata %v: gRPC would not retry it", r.header)
			}
			if r.code != tt.code || first(r.trailer, "grpc-retry-pushback-ms") != tt.pushback || first(r.trailer, "ratelimit") != tt.header {
				t.Errorf("denial: %v, pushback %q, ratelimit %q; want %v, %q, %q", r.code,
					first(r.trailer, "grpc-retry-pushback-ms"), first(r.trailer, "ratelimit"), tt.code, tt.pushback, tt.header)
			}
		})
	}
}

// A stream gets the fields in its header metadata, and a denied one the
// fields and the pushback in its trailer.
func TestStreamMetadata(t *testing.T) {
	mem := newMem(t, memstore.Options{Now: sluicetest.NewClock(start).Now, SweepInterval: -1})
	in, err := grpclimit.New(mem, grpclimit.Options{
		Policy: "streams",
		Key:    grpclimit.MetadataKey("x-api-key"),
		Limit:  sluice.Limit{Capacity: 1, Rate: sluice.Every(time.Minute)},
	})
	if err != nil {
		t.Fatal(err)
	}
	client, _ := server(t, in)
	ctx, cancel := context.WithCancel(withKey("a"))
	defer cancel()
	w, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := w.Header()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := first(h, "ratelimit"), `"streams";r=0;t=60`; got != want {
		t.Errorf("allowed stream: ratelimit %q, want %q", got, want)
	}
	w, err = client.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second stream: %v, want ResourceExhausted", err)
	}
	if got, want := fmt.Sprint(first(w.Trailer(), "grpc-retry-pushback-ms"), " ", first(w.Trailer(), "ratelimit")), `60000 "streams";r=0;t=60`; got != want {
		t.Errorf("denied stream: trailer pushback and ratelimit %s, want %s", got, want)
	}
}

// plain is a sluice.Store that is not a sluice.Operator.
type plain struct{ sluice.Store }

func TestNewInvalidLimits(t *testing.T) {
	store := newMem(t, memstore.Options{Now: sluicetest.NewClock(start).Now, SweepInterval: -1})
	two := []grpclimit.Limit{{Policy: "a", Limit: burstLimit}, {Policy: "b", Limit: dailyLimit}}
	tests := []struct {
		name  string
		store sluice.Store
		opts  grpclimit.Options
		want  error
		msg   string
	}{
		{name: "Policy and Limits", store: store, opts: grpclimit.Options{Policy: "a", Limits: two}, want: sluice.ErrInvalidOption},
		{name: "a store that is not a sluice.Operator", store: plain{store}, opts: grpclimit.Options{Limits: two}, want: sluice.ErrInvalidOption, msg: "sluice.Operator"},
		{name: "request ID metadata", store: store, opts: grpclimit.Options{Limits: two, RequestIDMetadata: "idempotency-key"}, want: sluice.ErrInvalidOption, msg: "Options.RequestIDMetadata"},
		{name: "one policy twice", store: store, opts: grpclimit.Options{Limits: []grpclimit.Limit{{Policy: "a", Limit: burstLimit}, {Policy: "a", Limit: dailyLimit}}}, want: sluice.ErrInvalidOption},
		{name: "no policy", store: store, opts: grpclimit.Options{Limits: []grpclimit.Limit{{Limit: dailyLimit}}}, want: sluice.ErrInvalidPolicy, msg: "Options.Limits[0].Policy"},
		{name: "quota code out of range", store: store, opts: grpclimit.Options{Policy: "a", Limit: burstLimit, QuotaCode: 17}, want: sluice.ErrInvalidOption, msg: "QuotaCode 17"},
		{name: "degraded code out of range", store: store, opts: grpclimit.Options{Policy: "a", Limit: burstLimit, DegradedCode: 99}, want: sluice.ErrInvalidOption, msg: "DegradedCode 99"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := grpclimit.New(tt.store, tt.opts)
			if !errors.Is(err, tt.want) || !strings.Contains(fmt.Sprint(err), tt.msg) {
				t.Errorf("New error = %v, want %v mentioning %q", err, tt.want, tt.msg)
			}
		})
	}
}

// Each limit keys the call its own way, and a key one of them cannot find
// fails the call before anything is charged.
func TestSeveralLimitsKeys(t *testing.T) {
	store := newMem(t, memstore.Options{Now: sluicetest.NewClock(start).Now, SweepInterval: -1})
	in, err := grpclimit.New(store, grpclimit.Options{
		Key: grpclimit.MetadataKey("x-api-key"),
		Limits: []grpclimit.Limit{
			{Policy: "per-key", Limit: burstLimit},
			{Policy: "per-tenant", Limit: dailyLimit, Key: grpclimit.MetadataKey("x-tenant")},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := unary(in, fromPeer("192.0.2.1:1", "x-api-key", "k"), "/m"); status.Code(err) != codes.InvalidArgument {
		t.Errorf("without x-tenant: %v, want InvalidArgument", err)
	}
	if err := unary(in, fromPeer("192.0.2.1:1", "x-api-key", "k", "x-tenant", "t"), "/m"); err != nil {
		t.Errorf("with both keys: %v", err)
	}
	for _, r := range []sluice.Request{
		{Policy: "per-key", Key: "x-api-key:k", Cost: 1, Limit: burstLimit},
		{Policy: "per-tenant", Key: "x-tenant:t", Cost: 1, Limit: dailyLimit},
	} {
		p, err := store.Peek(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		if p.Remaining != r.Limit.Capacity-1 {
			t.Errorf("%s bucket %q: %d remaining, want %d (one call)", r.Policy, r.Key, p.Remaining, r.Limit.Capacity-1)
		}
	}
}

// flaky fails its first Check with Unavailable and answers the next.
type flaky struct {
	healthpb.UnimplementedHealthServer
	calls atomic.Int64
}

func (f *flaky) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if f.calls.Add(1) == 1 {
		return nil, status.Error(codes.Unavailable, "warming up")
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// The quota fields of an allowed call must not keep gRPC from retrying
// the handler's own retryable error: response headers commit a call, so
// the fields of a call that fails go in its trailer.
func TestAllowedCallStillRetried(t *testing.T) {
	mem := newMem(t, memstore.Options{SweepInterval: -1})
	in, err := grpclimit.New(mem, grpclimit.Options{
		Policy: "api",
		Key:    grpclimit.MetadataKey("x-api-key"),
		Limit:  sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)},
	})
	if err != nil {
		t.Fatal(err)
	}
	svc := &flaky{}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(in.Unary()))
	healthpb.RegisterHealthServer(srv, svc)
	var wg sync.WaitGroup
	wg.Go(func() { srv.Serve(lis) }) //nolint:errcheck // returns when stopped
	defer func() { srv.Stop(); wg.Wait() }()
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"methodConfig": [{
			"name": [{"service": "grpc.health.v1.Health"}],
			"retryPolicy": {"maxAttempts": 2, "initialBackoff": "0.01s", "maxBackoff": "0.01s",
				"backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(withKey("a"), 10*time.Second)
	defer cancel()
	var header, trailer metadata.MD
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header), grpc.Trailer(&trailer)); err != nil {
		t.Fatalf("Check: %v, want the handler's Unavailable retried", err)
	}
	if got := svc.calls.Load(); got != 2 {
		t.Errorf("handler called %d times, want 2", got)
	}
	if got, want := first(header, "ratelimit"), `"api";r=8;t=1`; got != want {
		t.Errorf("ratelimit header of the successful attempt = %q, want %q", got, want)
	}
}

// A stream whose handler fails before sending anything keeps a
// trailers-only answer, with the fields in the trailer; one that sends has
// them in its header.
func TestStreamFieldsWhenTheHandlerFails(t *testing.T) {
	mem := newMem(t, memstore.Options{Now: sluicetest.NewClock(start).Now, SweepInterval: -1})
	in, err := grpclimit.New(mem, grpclimit.Options{
		Policy: "streams",
		Key:    grpclimit.MetadataKey("x-api-key"),
		Limit:  sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)},
	})
	if err != nil {
		t.Fatal(err)
	}
	desc := grpc.ServiceDesc{
		ServiceName: "test.S",
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{
			StreamName:    "Fail",
			ServerStreams: true,
			Handler: func(any, grpc.ServerStream) error {
				return status.Error(codes.Unavailable, "warming up")
			},
		}},
	}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.ChainStreamInterceptor(in.Stream()))
	srv.RegisterService(&desc, struct{}{})
	var wg sync.WaitGroup
	wg.Go(func() { srv.Serve(lis) }) //nolint:errcheck // returns when stopped
	defer func() { srv.Stop(); wg.Wait() }()
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cs, err := conn.NewStream(withKey("a"), &desc.Streams[0], "/test.S/Fail")
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if err := cs.RecvMsg(new(healthpb.HealthCheckResponse)); status.Code(err) != codes.Unavailable {
		t.Fatalf("RecvMsg: %v, want the handler's Unavailable", err)
	}
	if h, _ := cs.Header(); len(h) > 0 {
		t.Errorf("header %v: a failed stream must stay trailers-only", h)
	}
	if got, want := first(cs.Trailer(), "ratelimit"), `"streams";r=9;t=1`; got != want {
		t.Errorf("trailer ratelimit = %q, want %q", got, want)
	}
}
