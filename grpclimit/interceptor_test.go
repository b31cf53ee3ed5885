package grpclimit_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
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
	"google.golang.org/grpc/peer"
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

func (s failing) Peek(context.Context, sluice.Request) (sluice.Decision, error) {
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
			opts: grpclimit.Options{Policy: "api", Key: key, Limit: sluice.Limit{Capacity: 2, Rate: sluice.Per(1, 2*time.Second)}},
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
			opts: grpclimit.Options{Policy: "api", Key: key, Limit: sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(0)}},
			calls: []call{
				{ctx: withKey("a"), code: codes.OK},
				{ctx: withKey("a"), code: codes.ResourceExhausted, retry: -1},
			},
		},
		{
			name: "missing key, bad cost, bad limit",
			opts: grpclimit.Options{Policy: "api", Key: key, Limit: sluice.Limit{Capacity: 2, Rate: sluice.PerSecond(1)}, Cost: cost},
			calls: []call{
				{ctx: context.Background(), code: codes.InvalidArgument},
				{ctx: withKey(strings.Repeat("k", sluice.MaxKeyLen)), code: codes.InvalidArgument},
				{ctx: withKey("a", "x-cost", "xxx"), code: codes.Internal},
				{ctx: withKey("a", "x-cost", "xx"), code: codes.OK},
			},
		},
		{
			// The key is the store key as it is: all of sluice.MaxKeyLen
			// is the caller's.
			name: "the whole key length bound is the key function's",
			opts: grpclimit.Options{
				Policy: "api",
				Key:    rawKey,
				Limit:  sluice.Limit{Capacity: 2, Rate: sluice.PerSecond(1)},
			},
			calls: []call{
				{ctx: withKey(strings.Repeat("k", sluice.MaxKeyLen)), code: codes.OK},
				{ctx: withKey(strings.Repeat("k", sluice.MaxKeyLen+1)), code: codes.InvalidArgument},
			},
		},
		{
			name: "default key: an in-memory peer has no address",
			opts: grpclimit.Options{Policy: "api", Limit: sluice.Limit{Capacity: 2, Rate: sluice.PerSecond(1)}},
			calls: []call{
				{ctx: context.Background(), code: codes.InvalidArgument},
			},
		},
		{
			name: "request IDs",
			opts: grpclimit.Options{
				Policy: "api", Key: key, Limit: sluice.Limit{Capacity: 1, Rate: sluice.Every(10 * time.Second)},
				RequestIDMetadata: "Idempotency-Key", Cost: cost,
			},
			calls: []call{
				{ctx: withKey("a", "idempotency-key", "1"), code: codes.OK},
				{ctx: withKey("a", "idempotency-key", "1"), code: codes.OK}, // not charged again
				{ctx: withKey("a", "idempotency-key", "2"), code: codes.ResourceExhausted, retry: 10 * time.Second},
				// A denial is not remembered: its retry is decided afresh,
				// and the allowed decision is remembered from then on.
				{advance: 10 * time.Second, ctx: withKey("a", "idempotency-key", "2"), code: codes.OK},
				{ctx: withKey("a", "idempotency-key", "2"), code: codes.OK},
				{ctx: withKey("a", "idempotency-key", "1", "x-cost", "x"), code: codes.OK},
				{ctx: withKey("a", "idempotency-key", "3", "x-cost", "x"), code: codes.ResourceExhausted, retry: 10 * time.Second},
			},
		},
		{
			name: "store error is Unavailable",
			opts: grpclimit.Options{Policy: "api", Key: key, Limit: sluice.Limit{Capacity: 2, Rate: sluice.PerSecond(1)}},
			wrap: func(sluice.Store) sluice.Store { return failing{errDown} },
			calls: []call{
				{ctx: withKey("a"), code: codes.Unavailable},
			},
		},
		{
			name: "degraded allow passes, degraded deny is Unavailable",
			opts: grpclimit.Options{Policy: "api", Key: key, Limit: sluice.Limit{Capacity: 1, Rate: sluice.Every(time.Minute)}},
			wrap: func(s sluice.Store) sluice.Store { return degraded{Store: s} },
			calls: []call{
				{ctx: withKey("a"), code: codes.OK},
				{ctx: withKey("a"), code: codes.Unavailable, retry: time.Minute},
			},
		},
		{
			name: "degraded deny without a wait",
			opts: grpclimit.Options{Policy: "api", Key: key, Limit: sluice.Limit{Capacity: 1, Rate: sluice.Every(time.Minute)}},
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
			mem := newMem(t, memstore.Options{Now: clock.Now, SweepInterval: -1})
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
					if qf == nil || len(qf.Violations) != 1 || qf.Violations[0].QuotaId != tt.opts.Policy ||
						qf.Violations[0].QuotaValue != tt.opts.Limit.Capacity {
						t.Errorf("call %d: QuotaFailure %v, want one violation of quota %q with value %d", i, qf, tt.opts.Policy, tt.opts.Limit.Capacity)
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
	mem := newMem(t, memstore.Options{Now: clock.Now, SweepInterval: -1})
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
		Policy: "api",
		Key:    grpclimit.MetadataKey("x-api-key"),
		Limit:  sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(1)},
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

// rawKey keys a call by its x-api-key metadata as it is, without a prefix.
func rawKey(ctx context.Context, _ string) (string, error) {
	if vs := metadata.ValueFromIncomingContext(ctx, "x-api-key"); len(vs) > 0 {
		return vs[0], nil
	}
	return "", nil
}

// unary calls in's unary interceptor directly, as the server would for
// method, and returns its error (nil if the call reached the handler).
func unary(in *grpclimit.Interceptor, ctx context.Context, method string) error {
	_, err := in.Unary()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: method},
		func(context.Context, any) (any, error) { return nil, nil })
	return err
}

// fromPeer returns an incoming context of a call from the peer at addr
// ("192.0.2.1:4711"), with metadata key-value pairs kv.
func fromPeer(addr string, kv ...string) context.Context {
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: net.TCPAddrFromAddrPort(netip.MustParseAddrPort(addr))})
	return metadata.NewIncomingContext(ctx, metadata.Pairs(kv...))
}

// A loose limit on the API's methods (100/s) and a strict one on Login
// (5/h), on one store, for the same peer. Only a policy of its own keeps
// the login quota apart: left at a shared default name, both interceptors
// would charge one bucket per peer, and every API call would convert it
// back to the API's limit and refill it, so that no login was ever denied.
// The policy name is therefore required.
func TestLoginAndAPIPolicies(t *testing.T) {
	apiLimit := sluice.Limit{Capacity: 100, Rate: sluice.PerSecond(100)}
	loginLimit := sluice.Limit{Capacity: 5, Rate: sluice.Per(5, time.Hour)}
	tests := []struct {
		name       string
		api, login string
		wantErr    error
	}{
		{name: "left at the zero policy", wantErr: sluice.ErrInvalidPolicy},
		{name: "a policy each", api: "api", login: "login"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := sluicetest.NewClock(start)
			mem := newMem(t, memstore.Options{Now: clock.Now, SweepInterval: -1})
			api, errAPI := grpclimit.New(mem, grpclimit.Options{Policy: tt.api, Limit: apiLimit})
			login, errLogin := grpclimit.New(mem, grpclimit.Options{Policy: tt.login, Limit: loginLimit})
			for _, err := range []error{errAPI, errLogin} {
				if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
					t.Errorf("New error = %v, want %v", err, tt.wantErr)
				}
				if tt.wantErr == nil && err != nil {
					t.Fatalf("New: %v", err)
				}
			}
			if errAPI != nil || errLogin != nil {
				return
			}
			// Whatever New accepted must keep the login quota.
			ctx := fromPeer("192.0.2.1:4711")
			apis, logins := map[codes.Code]int{}, map[codes.Code]int{}
			for range 60 {
				for range 10 {
					apis[status.Code(unary(api, ctx, "/shop.Orders/List"))]++
				}
				logins[status.Code(unary(login, ctx, "/shop.Accounts/Login"))]++
				clock.Advance(time.Second)
			}
			if want := map[codes.Code]int{codes.OK: 5, codes.ResourceExhausted: 55}; fmt.Sprint(logins) != fmt.Sprint(want) {
				t.Errorf("60 logins in 60 s: codes = %v, want %v", logins, want)
			}
			if want := map[codes.Code]int{codes.OK: 600}; fmt.Sprint(apis) != fmt.Sprint(want) {
				t.Errorf("600 API calls in 60 s: codes = %v, want %v", apis, want)
			}
		})
	}
}

// Two interceptors with different policies on one store never share a
// bucket, whatever their keys: not for the same peer, and not when the
// policy and the key, joined with a colon, spell the same string.
func TestPoliciesNeverShare(t *testing.T) {
	tests := []struct {
		name          string
		policyA, keyA string
		policyB, keyB string
	}{
		{name: "same peer", policyA: "login", policyB: "api"},
		{name: "same key", policyA: "login", keyA: "user:7", policyB: "api", keyB: "user:7"},
		{name: "policy and key join to the same string", policyA: "a", keyA: "b:c", policyB: "a:b", keyB: "c"},
	}
	never := sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(0)}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mem := newMem(t, memstore.Options{SweepInterval: -1})
			type caller struct {
				in  *grpclimit.Interceptor
				ctx context.Context
			}
			newCaller := func(policy, key string) caller {
				o := grpclimit.Options{Policy: policy, Limit: never}
				ctx := fromPeer("192.0.2.1:4711")
				if key != "" {
					o.Key = rawKey
					ctx = fromPeer("192.0.2.1:4711", "x-api-key", key)
				}
				in, err := grpclimit.New(mem, o)
				if err != nil {
					t.Fatal(err)
				}
				return caller{in, ctx}
			}
			callers := []caller{newCaller(tt.policyA, tt.keyA), newCaller(tt.policyB, tt.keyB)}
			for i, c := range callers {
				if err := unary(c.in, c.ctx, "/m"); err != nil {
					t.Errorf("first call through interceptor %d: %v, want it allowed (a bucket of its own)", i, err)
				}
			}
			for i, c := range callers {
				if got := status.Code(unary(c.in, c.ctx, "/m")); got != codes.ResourceExhausted {
					t.Errorf("second call through interceptor %d: code %v, want %v", i, got, codes.ResourceExhausted)
				}
			}
		})
	}
}

// The store key is the key function's key as it is, under the policy: no
// prefix is added to it.
func TestStoreKeyIsTheKey(t *testing.T) {
	mem := newMem(t, memstore.Options{SweepInterval: -1})
	l := sluice.Limit{Capacity: 3, Rate: sluice.PerSecond(0)}
	in, err := grpclimit.New(mem, grpclimit.Options{Policy: "login", Limit: l})
	if err != nil {
		t.Fatal(err)
	}
	if err := unary(in, fromPeer("192.0.2.1:4711"), "/m"); err != nil {
		t.Fatal(err)
	}
	d, err := mem.Peek(context.Background(), sluice.Request{Policy: "login", Key: "ip:192.0.2.1", Cost: 1, Limit: l})
	if err != nil {
		t.Fatalf("Peek: %v", err)
	}
	if d.Remaining != 2 {
		t.Errorf("Peek(login, ip:192.0.2.1) = %+v, want 2 remaining (one call taken)", d)
	}
}

// counting passes every call to the store under it and counts the tokens
// that store charged: the cost of every allowed decision that is not a
// replay.
type counting struct {
	sluice.Store
	charged atomic.Int64
}

func (s *counting) Take(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	d, err := s.Store.Take(ctx, r)
	if err == nil && d.Allowed && !d.Replayed {
		s.charged.Add(r.Cost)
	}
	return d, err
}

// A call denied and retried under one request ID is charged once, when it
// is allowed: its denials took nothing, and the retries after the allowed
// one replay it. (The interceptor used to take a replayed denial again
// without the ID, so every later retry was charged anew.)
func TestDeniedRetriesChargedOnce(t *testing.T) {
	clock := sluicetest.NewClock(start)
	store := &counting{Store: newMem(t, memstore.Options{Now: clock.Now, SweepInterval: -1})}
	in, err := grpclimit.New(store, grpclimit.Options{
		Policy:            "orders",
		Key:               grpclimit.MetadataKey("x-api-key"),
		Limit:             sluice.Limit{Capacity: 3, Rate: sluice.Every(10 * time.Second)},
		RequestIDMetadata: "idempotency-key",
	})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		unary(in, fromPeer("192.0.2.1:4711", "x-api-key", "u"), "/m") //nolint:errcheck // empties the bucket
	}
	store.charged.Store(0)
	retry := fromPeer("192.0.2.1:4711", "x-api-key", "u", "idempotency-key", "order-1")
	for i, c := range []struct {
		advance time.Duration
		code    codes.Code
	}{
		{0, codes.ResourceExhausted},                                                             // the call
		{0, codes.ResourceExhausted}, {0, codes.ResourceExhausted}, {0, codes.ResourceExhausted}, // three retries while empty
		{30 * time.Second, codes.OK},
		{0, codes.OK}, {0, codes.OK}, // replays
	} {
		clock.Advance(c.advance)
		if got := status.Code(unary(in, retry, "/m")); got != c.code {
			t.Errorf("attempt %d: code %v, want %v", i, got, c.code)
		}
	}
	if got := store.charged.Load(); got != 1 {
		t.Errorf("tokens charged for one call and its retries = %d, want 1", got)
	}
}

// bounded decides only limits whose period is at most maxPeriod, standing
// in for a store whose arithmetic is exact only in a range (the Redis
// store's): it refuses other limits at CheckLimit and on every call.
type bounded struct {
	sluice.Store
	maxPeriod time.Duration
}

func (s bounded) CheckLimit(l sluice.Limit) error {
	if l.Rate.Period > s.maxPeriod {
		return fmt.Errorf("%w: period %v is longer than %v, the longest this store decides exactly", sluice.ErrInvalidLimit, l.Rate.Period, s.maxPeriod)
	}
	return nil
}

func (s bounded) Take(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := s.CheckLimit(r.Limit); err != nil {
		return sluice.Decision{}, err
	}
	return s.Store.Take(ctx, r)
}

// A fixed limit the store cannot decide fails New, rather than every call
// with codes.Internal; a limit from LimitFunc is the store's to refuse, per
// call.
func TestNewChecksLimitWithStore(t *testing.T) {
	day := 24 * time.Hour
	store := bounded{Store: newMem(t, memstore.Options{SweepInterval: -1}), maxPeriod: 365 * day}
	tooLong := sluice.Limit{Capacity: 143, Rate: sluice.Every(366 * day)}
	fits := sluice.Limit{Capacity: 143, Rate: sluice.Every(365 * day)}
	ctx := fromPeer("192.0.2.1:4711")

	if _, err := grpclimit.New(store, grpclimit.Options{Policy: "yearly", Limit: tooLong}); !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Errorf("New(Limit %v) error = %v, want %v", tooLong, err, sluice.ErrInvalidLimit)
	}
	in, err := grpclimit.New(store, grpclimit.Options{Policy: "yearly", Limit: fits})
	if err != nil {
		t.Fatalf("New(Limit %v): %v", fits, err)
	}
	if err := unary(in, ctx, "/m"); err != nil {
		t.Errorf("Limit %v: %v, want the call allowed", fits, err)
	}

	var got error
	in, err = grpclimit.New(store, grpclimit.Options{
		Policy:    "yearly",
		LimitFunc: func(context.Context, string) (sluice.Limit, error) { return tooLong, nil },
		ErrorHandler: func(ctx context.Context, method string, err error) error {
			got = err
			return grpclimit.DefaultErrorHandler(ctx, method, err)
		},
	})
	if err != nil {
		t.Fatalf("New(LimitFunc): %v", err)
	}
	if code := status.Code(unary(in, ctx, "/m")); code != codes.Internal || !errors.Is(got, sluice.ErrInvalidLimit) {
		t.Errorf("LimitFunc %v: code %v, error %v; want %v and %v", tooLong, code, got, codes.Internal, sluice.ErrInvalidLimit)
	}
}

func TestNewInvalid(t *testing.T) {
	mem := newMem(t, memstore.Options{SweepInterval: -1})
	ok := sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(1)}
	limitFunc := func(context.Context, string) (sluice.Limit, error) { return ok, nil }
	tests := []struct {
		name  string
		store sluice.Store
		opts  grpclimit.Options
		want  error
	}{
		{name: "no limit", store: mem, opts: grpclimit.Options{Policy: "p"}, want: sluice.ErrInvalidLimit},
		{name: "both limits", store: mem, opts: grpclimit.Options{Policy: "p", Limit: ok, LimitFunc: limitFunc}, want: sluice.ErrInvalidOption},
		{name: "nil store", opts: grpclimit.Options{Policy: "p", Limit: ok}, want: sluice.ErrInvalidOption},
		{name: "no policy", store: mem, opts: grpclimit.Options{Limit: ok}, want: sluice.ErrInvalidPolicy},
		{name: "no policy with LimitFunc", store: mem, opts: grpclimit.Options{LimitFunc: limitFunc}, want: sluice.ErrInvalidPolicy},
		{name: "policy too long", store: mem, opts: grpclimit.Options{Limit: ok, Policy: strings.Repeat("p", sluice.MaxPolicyLen+1)}, want: sluice.ErrInvalidPolicy},
		{name: "policy with a space", store: mem, opts: grpclimit.Options{Limit: ok, Policy: "per key"}, want: sluice.ErrInvalidPolicy},
		{name: "policy not printable", store: mem, opts: grpclimit.Options{Limit: ok, Policy: "a\x00"}, want: sluice.ErrInvalidPolicy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := grpclimit.New(tt.store, tt.opts); !errors.Is(err, tt.want) {
				t.Errorf("New(%+v) error = %v, want %v", tt.opts, err, tt.want)
			}
		})
	}
	for _, o := range []grpclimit.Options{
		{Policy: strings.Repeat("p", sluice.MaxPolicyLen), Limit: ok},
		{Policy: "p", LimitFunc: limitFunc},
	} {
		if _, err := grpclimit.New(mem, o); err != nil {
			t.Errorf("New(%+v): %v", o, err)
		}
	}
}
