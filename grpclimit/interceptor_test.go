package grpclimit_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
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

var start = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// server runs the health service behind in's interceptors on an in-memory
// connection and returns a client and a count of calls that reached the
// service.
func server(t *testing.T, in *grpclimit.Interceptor) (healthpb.HealthClient, *atomic.Int64) {
	t.Helper()
	var reached atomic.Int64
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(in.Unary(), func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			reached.Add(1)
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(in.Stream(), func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			reached.Add(1)
			return h(srv, ss)
		}),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	var wg sync.WaitGroup
	wg.Go(func() { srv.Serve(lis) }) //nolint:errcheck // returns when stopped
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
		wg.Wait()
	})
	return healthpb.NewHealthClient(conn), &reached
}

func withKey(key string, kv ...string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), append([]string{"x-api-key", key}, kv...)...)
}

// details returns the RetryInfo and QuotaFailure of a status error.
func details(err error) (*errdetails.RetryInfo, *errdetails.QuotaFailure) {
	var ri *errdetails.RetryInfo
	var qf *errdetails.QuotaFailure
	for _, d := range status.Convert(err).Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			ri = d
		case *errdetails.QuotaFailure:
			qf = d
		}
	}
	return ri, qf
}

type degraded struct {
	sluice.Store
	decision *sluice.Decision
}

func (s degraded) Take(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if s.decision != nil {
		return *s.decision, nil
	}
	d, err := s.Store.Take(ctx, r)
	d.Degraded = true
	return d, err
}

type failing struct{ err error }

func (s failing) Take(context.Context, sluice.Request) (sluice.Decision, error) {
	return sluice.Decision{}, s.err
}

func (s failing) Peek(context.Context, string, sluice.Limit) (sluice.Decision, error) {
	return sluice.Decision{}, s.err
}

// call is one unary Check: with this context, after moving the clock,
// expecting this code and, for a denial, this RetryInfo delay (-1: none).
type call struct {
	advance time.Duration
	ctx     context.Context
	code    codes.Code
	retry   time.Duration
}

func TestUnary(t *testing.T) {
	errDown := errors.New("dial tcp 10.1.1.1:6379: connection refused")
	key := grpclimit.MetadataKey("X-Api-Key")
	cost := func(ctx context.Context, _ string) (int64, error) {
		if v := metadata.ValueFromIncomingContext(ctx, "x-cost"); len(v) > 0 {
			return int64(len(v[0])), nil // "xxx" costs 3
		}
		return 1, nil
	}
	tests := []struct {
		name  string
		opts  grpclimit.Options
		wrap  func(sluice.Store) sluice.Store
		calls []call
	}{
		{
			name: "burst, deny with RetryInfo, refill",
			opts: grpclimit.Options{Key: key, Limit: sluice.Limit{Capacity: 2, Rate: sluice.Per(1, 2*time.Second)}},
			calls: []call{
				{ctx: withKey("a"), code: codes.OK},
				{ctx: withKey("a"), code: codes.OK},
				{ctx: withKey("a"), code: codes.ResourceExhausted, retry: 2 * time.Second},
				{ctx: withKey("b"), code: codes.OK},
				{advance: 1500 * time.Millisecond, ctx: withKey("a"), code: codes.ResourceExhausted, retry: 500 * time.Millisecond},
				{advance: 500 * time.Millisecond, ctx: withKey("a"), code: codes.OK},
			},
		},
		{
			name: "never refills: no RetryInfo",
			opts: grpclimit.Options{Key: key, Limit: sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(0)}},
			calls: []call{
				{ctx: withKey("a"), code: codes.OK},
				{ctx: withKey("a"), code: codes.ResourceExhausted, retry: -1},
			},
		},
		{
			name: "missing key, bad cost, bad limit",
			opts: grpclimit.Options{Key: key, Limit: sluice.Limit{Capacity: 2, Rate: sluice.PerSecond(1)}, Cost: cost},
			calls: []call{
				{ctx: context.Background(), code: codes.InvalidArgument},
				{ctx: withKey(strings.Repeat("k", sluice.MaxKeyLen)), code: codes.InvalidArgument},
				{ctx: withKey("a", "x-cost", "xxx"), code: codes.Internal},
				{ctx: withKey("a", "x-cost", "xx"), code: codes.OK},
			},
		},
		{
			name: "default key: an in-memory peer has no address",
			opts: grpclimit.Options{Limit: sluice.Limit{Capacity: 2, Rate: sluice.PerSecond(1)}},
			calls: []call{
				{ctx: context.Background(), code: codes.InvalidArgument},
			},
		},
		{
			name: "request IDs",
			opts: grpclimit.Options{
				Key: key, Limit: sluice.Limit{Capacity: 1, Rate: sluice.Every(10 * time.Second)},
				RequestIDMetadata: "Idempotency-Key", Cost: cost,
			},
			calls: []call{
				{ctx: withKey("a", "idempotency-key", "1"), code: codes.OK},
				{ctx: withKey("a", "idempotency-key", "1"), code: codes.OK}, // not charged again
				{ctx: withKey("a", "idempotency-key", "2"), code: codes.ResourceExhausted, retry: 10 * time.Second},
				{advance: 10 * time.Second, ctx: withKey("a", "idempotency-key", "2"), code: codes.OK}, // a retried denial is taken again
				{ctx: withKey("a", "idempotency-key", "1", "x-cost", "x"), code: codes.OK},
				{ctx: withKey("a", "idempotency-key", "3", "x-cost", "x"), code: codes.ResourceExhausted, retry: 10 * time.Second},
			},
		},
		{
			name: "store error is Unavailable",
			opts: grpclimit.Options{Key: key, Limit: sluice.Limit{Capacity: 2, Rate: sluice.PerSecond(1)}},
			wrap: func(sluice.Store) sluice.Store { return failing{errDown} },
			calls: []call{
				{ctx: withKey("a"), code: codes.Unavailable},
			},
		},
		{
			name: "degraded allow passes, degraded deny is Unavailable",
			opts: grpclimit.Options{Key: key, Limit: sluice.Limit{Capacity: 1, Rate: sluice.Every(time.Minute)}},
			wrap: func(s sluice.Store) sluice.Store { return degraded{Store: s} },
			calls: []call{
				{ctx: withKey("a"), code: codes.OK},
				{ctx: withKey("a"), code: codes.Unavailable, retry: time.Minute},
			},
		},
		{
			name: "degraded deny without a wait",
			opts: grpclimit.Options{Key: key, Limit: sluice.Limit{Capacity: 1, Rate: sluice.Every(time.Minute)}},
			wrap: func(s sluice.Store) sluice.Store {
				return degraded{Store: s, decision: &sluice.Decision{RetryAfter: sluice.Never, Degraded: true}}
			},
			calls: []call{
				{ctx: withKey("a"), code: codes.Unavailable, retry: -1},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := sluicetest.NewClock(start)
			mem := memstore.New(memstore.Options{Now: clock.Now, SweepInterval: -1})
			defer mem.Close()
			var store sluice.Store = mem
			if tt.wrap != nil {
				store = tt.wrap(mem)
			}
			in, err := grpclimit.New(store, tt.opts)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			client, reached := server(t, in)
			for i, c := range tt.calls {
				clock.Advance(c.advance)
				before := reached.Load()
				_, err := client.Check(c.ctx, &healthpb.HealthCheckRequest{})
				if got := status.Code(err); got != c.code {
					t.Fatalf("call %d: code = %v (%v), want %v", i, got, err, c.code)
				}
				if got, want := reached.Load()-before, int64(btoi(c.code == codes.OK)); got != want {
					t.Errorf("call %d: service reached %d times, want %d", i, got, want)
				}
				if strings.Contains(status.Convert(err).Message(), "10.1.1.1") {
					t.Errorf("call %d: message %q leaks the store's error", i, status.Convert(err).Message())
				}
				ri, qf := details(err)
				switch {
				case c.retry == -1 && ri != nil:
					t.Errorf("call %d: RetryInfo %v, want none", i, ri)
				case c.retry > 0 && (ri == nil || ri.GetRetryDelay().AsDuration() != c.retry):
					t.Errorf("call %d: RetryInfo %v, want a delay of %v", i, ri, c.retry)
				}
				if c.code == codes.ResourceExhausted {
					if qf == nil || len(qf.Violations) != 1 || qf.Violations[0].QuotaId != "default" ||
						qf.Violations[0].QuotaValue != tt.opts.Limit.Capacity {
						t.Errorf("call %d: QuotaFailure %v, want one violation of quota \"default\" with value %d", i, qf, tt.opts.Limit.Capacity)
					}
				} else if qf != nil {
					t.Errorf("call %d: QuotaFailure %v on code %v", i, qf, c.code)
				}
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestStream(t *testing.T) {
	clock := sluicetest.NewClock(start)
	mem := memstore.New(memstore.Options{Now: clock.Now, SweepInterval: -1})
	defer mem.Close()
	in, err := grpclimit.New(mem, grpclimit.Options{
		Key:    grpclimit.MetadataKey("x-api-key"),
		Limit:  sluice.Limit{Capacity: 1, Rate: sluice.Every(time.Minute)},
		Policy: "streams",
	})
	if err != nil {
		t.Fatal(err)
	}
	client, reached := server(t, in)
	watch := func() error {
		ctx, cancel := context.WithCancel(withKey("a"))
		defer cancel()
		w, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return err
		}
		_, err = w.Recv()
		return err
	}
	if err := watch(); err != nil {
		t.Fatalf("first stream: %v", err)
	}
	err = watch()
	if got := status.Code(err); got != codes.ResourceExhausted {
		t.Fatalf("second stream: code = %v (%v), want %v", got, err, codes.ResourceExhausted)
	}
	ri, qf := details(err)
	if ri.GetRetryDelay().AsDuration() != time.Minute {
		t.Errorf("RetryInfo = %v, want a delay of 1m", ri)
	}
	if len(qf.GetViolations()) != 1 || qf.Violations[0].QuotaId != "streams" {
		t.Errorf("QuotaFailure = %v, want one violation of quota \"streams\"", qf)
	}
	if got := reached.Load(); got != 1 {
		t.Errorf("service reached %d times, want 1", got)
	}
	clock.Advance(time.Minute)
	if err := watch(); err != nil {
		t.Errorf("stream after a minute: %v", err)
	}
}

func TestErrorHandler(t *testing.T) {
	errDown := errors.New("connection refused")
	var got error
	in, err := grpclimit.New(failing{errDown}, grpclimit.Options{
		Key:   grpclimit.MetadataKey("x-api-key"),
		Limit: sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(1)},
		ErrorHandler: func(ctx context.Context, method string, err error) error {
			got = err
			return status.Error(codes.Aborted, method)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	client, _ := server(t, in)
	_, err = client.Check(withKey("a"), &healthpb.HealthCheckRequest{})
	if st := status.Convert(err); st.Code() != codes.Aborted || st.Message() != "/grpc.health.v1.Health/Check" {
		t.Errorf("Check error = %v, want Aborted with the method name", err)
	}
	if !errors.Is(got, grpclimit.ErrStore) || !errors.Is(got, errDown) {
		t.Errorf("ErrorHandler got %v, want it to wrap %v and %v", got, grpclimit.ErrStore, errDown)
	}
}

func TestNewInvalid(t *testing.T) {
	mem := memstore.New(memstore.Options{SweepInterval: -1})
	defer mem.Close()
	ok := sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(1)}
	limitFunc := func(context.Context, string) (sluice.Limit, error) { return ok, nil }
	tests := []struct {
		name  string
		store sluice.Store
		opts  grpclimit.Options
		want  error
	}{
		{name: "no limit", store: mem, want: sluice.ErrInvalidLimit},
		{name: "both limits", store: mem, opts: grpclimit.Options{Limit: ok, LimitFunc: limitFunc}, want: grpclimit.ErrInvalidOption},
		{name: "nil store", opts: grpclimit.Options{Limit: ok}, want: grpclimit.ErrInvalidOption},
		{name: "policy too long", store: mem, opts: grpclimit.Options{Limit: ok, Policy: strings.Repeat("p", grpclimit.MaxPolicyLen+1)}, want: grpclimit.ErrInvalidOption},
		{name: "policy not printable", store: mem, opts: grpclimit.Options{Limit: ok, Policy: "a\x00"}, want: grpclimit.ErrInvalidOption},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := grpclimit.New(tt.store, tt.opts); !errors.Is(err, tt.want) {
				t.Errorf("New(%+v) error = %v, want %v", tt.opts, err, tt.want)
			}
		})
	}
	if _, err := grpclimit.New(mem, grpclimit.Options{LimitFunc: limitFunc}); err != nil {
		t.Errorf("New with LimitFunc: %v", err)
	}
}
