package grpcapi

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice"
	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/memstore"
)

// testToken is the bearer token of servers started with auth.
const testToken = "s3cret-token"

// now is the fixed time of the test stores: nothing refills during a test,
// so every wait is exact.
var now = time.Unix(1_700_000_000, 0)

// testPolicies are the policies of the test servers.
var testPolicies = []service.Policy{
	// One token every 30 seconds.
	{Name: "api", Limit: sluice.Limit{Capacity: 2, Rate: sluice.Per(2, time.Minute)}},
	// Never refills.
	{Name: "once", Limit: sluice.Limit{Capacity: 1, Rate: sluice.Per(0, time.Second)}},
	// A burst of 3 (1 a second) and 2 an hour, decided together.
	{Name: "login", Limits: []sluice.Limit{
		{Capacity: 3, Rate: sluice.PerSecond(1)},
		{Capacity: 2, Rate: sluice.Per(2, time.Hour)},
	}},
	{Name: "shadow", Limit: sluice.Limit{Capacity: 1, Rate: sluice.Per(1, time.Hour)}, Shadow: true},
	{Name: "trial", Limits: []sluice.Limit{
		{Capacity: 1, Rate: sluice.Per(1, time.Hour)},
		{Capacity: 5, Rate: sluice.Per(5, time.Hour)},
	}, Shadow: true},
}

// faultStore is a memstore that fails the calls of the keys in errs with
// their error, and every call when down is set: a store that cannot be
// reached.
type faultStore struct {
	*memstore.Store
	errs map[string]error
	down bool
}

func (f *faultStore) fail(key string) error {
	if f.down {
		return fmt.Errorf("test store: connection refused: %w", sluice.ErrUnavailable)
	}
	return f.errs[key]
}

func (f *faultStore) Take(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := f.fail(r.Key); err != nil {
		return sluice.Decision{}, err
	}
	return f.Store.Take(ctx, r)
}

func (f *faultStore) Peek(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := f.fail(r.Key); err != nil {
		return sluice.Decision{}, err
	}
	return f.Store.Peek(ctx, r)
}

func (f *faultStore) TakeAll(ctx context.Context, rs []sluice.Request) (sluice.MultiDecision, error) {
	if err := f.fail(rs[0].Key); err != nil {
		return sluice.MultiDecision{}, err
	}
	return f.Store.TakeAll(ctx, rs)
}

func (f *faultStore) Drain(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := f.fail(r.Key); err != nil {
		return sluice.Decision{}, err
	}
	return f.Store.Drain(ctx, r)
}

func (f *faultStore) Refund(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := f.fail(r.Key); err != nil {
		return sluice.Decision{}, err
	}
	return f.Store.Refund(ctx, r)
}

func (f *faultStore) Reset(ctx context.Context, policy, key string) error {
	if err := f.fail(key); err != nil {
		return err
	}
	return f.Store.Reset(ctx, policy, key)
}

// newFaultStore returns a faultStore over a memstore on the fixed clock.
func newFaultStore(t *testing.T, errs map[string]error, down bool) *faultStore {
	t.Helper()
	m, err := memstore.New(memstore.Options{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return &faultStore{Store: m, errs: errs, down: down}
}

// syncBuffer is a log sink the server's goroutines may write to while the
// test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testServer is a Server behind a real gRPC server on a loopback port,
// with the health and reflection services and a streaming test service.
type testServer struct {
	conn   *grpc.ClientConn
	client sluicev1.RateLimiterClient
	log    *syncBuffer
}

// streamService is a streaming service of no importance, for the stream
// interceptor: its one method answers one empty message.
var streamService = grpc.ServiceDesc{
	ServiceName: "test.Stream",
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "Get",
		ServerStreams: true,
		Handler: func(_ any, ss grpc.ServerStream) error {
			return ss.SendMsg(&healthpb.HealthCheckResponse{})
		},
	}},
}

// start serves the test policies over store with options o, and returns a
// client connected to it.
func start(t *testing.T, store sluice.Store, o Options) *testServer {
	t.Helper()
	table, err := service.NewTable(store, "test", testPolicies)
	if err != nil {
		t.Fatal(err)
	}
	core, err := service.New(store, table, service.Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	o.Logger = slog.New(slog.NewTextHandler(logs, nil))
	api, err := New(core, o)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(api.UnaryAuth), grpc.ChainStreamInterceptor(api.StreamAuth))
	api.Register(srv)
	h := health.NewServer()
	healthpb.RegisterHealthServer(srv, h)
	reflection.Register(srv)
	srv.RegisterService(&streamService, struct{}{})

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return &testServer{conn: conn, client: sluicev1.NewRateLimiterClient(conn), log: logs}
}

// ctx is a context for one call, with the test token when withToken.
func callCtx(t *testing.T, withToken bool) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	if withToken {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testToken)
	}
	return ctx
}

// errSummary is what a test checks of an error status: its code and the
// detail that names what was wrong.
type errSummary struct {
	Code codes.Code
	// Field is the field of a BadRequest violation.
	Field string
	// Resource is "type name" of a ResourceInfo.
	Resource string
	// Precondition is "type subject" of a PreconditionFailure violation.
	Precondition string
	// Reason is "domain reason policy" of an ErrorInfo.
	Reason string
	// RetryDelay is a RetryInfo's delay.
	RetryDelay time.Duration
}

// summarize returns the summary of st, failing the test on a detail it
// does not know or a detail holding more than one violation.
func summarize(t *testing.T, st *status.Status) errSummary {
	t.Helper()
	s := errSummary{Code: st.Code()}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.BadRequest:
			if len(d.FieldViolations) != 1 {
				t.Errorf("BadRequest has %d violations, want 1: %v", len(d.FieldViolations), d)
				continue
			}
			s.Field = d.FieldViolations[0].Field
			if d.FieldViolations[0].Description == "" {
				t.Errorf("BadRequest violation of %q has no description", s.Field)
			}
		case *errdetails.ResourceInfo:
			s.Resource = d.ResourceType + " " + d.ResourceName
		case *errdetails.PreconditionFailure:
			if len(d.Violations) != 1 {
				t.Errorf("PreconditionFailure has %d violations, want 1: %v", len(d.Violations), d)
				continue
			}
			s.Precondition = d.Violations[0].Type + " " + d.Violations[0].Subject
		case *errdetails.ErrorInfo:
			s.Reason = d.Domain + " " + d.Reason + " " + d.Metadata["policy"]
		case *errdetails.RetryInfo:
			s.RetryDelay = d.RetryDelay.AsDuration()
		default:
			t.Errorf("unexpected detail %T: %v", d, d)
		}
	}
	return s
}

// errorOf summarizes the status of err, which must be one.
func errorOf(t *testing.T, err error) errSummary {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("error %v is not a gRPC status", err)
	}
	return summarize(t, st)
}

// dur is d as a proto Duration.
func dur(d time.Duration) *durationpb.Duration { return durationpb.New(d) }

// lim is the API's Limit of text.
func lim(t *testing.T, text string) *sluicev1.Limit {
	t.Helper()
	l, err := sluice.ParseLimit(text)
	if err != nil {
		t.Fatal(err)
	}
	return limit(l)
}
