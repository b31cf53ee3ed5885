package loadgen

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/url"
	"strings"
	"time"
	"unicode"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// The details of the service's gRPC answers the generator reads
// (proto/sluice/v1/sluice.proto).
const (
	reasonDegradedDenial = "DEGRADED_DENIAL"
	degradedHeader       = "x-sluice-degraded" // Envoy: a failure mode's allow
)

// grpcTarget sends sluice.v1 Take or TakeBatch calls, or Envoy's
// ShouldRateLimit, over Conns HTTP/2 connections that the request slots
// share (slot i uses connection i mod Conns). gRPC retries a call only
// when it never reached the server, so every take the service counts is
// one the generator counts.
type grpcTarget struct {
	addr       string // host:port
	envoy      bool
	policy     string
	domain     string
	descriptor string
	batch      int
	md         metadata.MD // the bearer token; nil for none
	conns      []*grpc.ClientConn
}

func openGRPC(ctx context.Context, c TargetConfig, envoy bool) (Target, error) {
	scheme := "grpc"
	if envoy {
		scheme = "envoy"
	}
	u, err := url.Parse(c.URL)
	if err != nil || u.Hostname() == "" || u.Port() == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return nil, fmt.Errorf("%w: target %q: want %s://HOST:PORT", sluice.ErrInvalidOption, redact(c.URL), scheme)
	}
	if envoy && (c.Domain == "" || c.Descriptor == "") {
		return nil, fmt.Errorf("%w: an envoy:// target needs a domain and a descriptor key (-domain, -descriptor): the take's key is the descriptor's value", sluice.ErrInvalidOption)
	}
	if err := checkHost(ctx, c.URL, u.Hostname(), c.AllowRemote); err != nil {
		return nil, err
	}
	n := max(c.Conns, 1)
	if n > c.Slots {
		return nil, fmt.Errorf("%w: %d connections for %d request slots: want 1 to the number of slots", sluice.ErrInvalidOption, n, c.Slots)
	}
	t := &grpcTarget{
		addr: u.Host, envoy: envoy, policy: c.Policy,
		domain: c.Domain, descriptor: c.Descriptor, batch: c.Batch,
	}
	if c.Token != "" {
		t.md = metadata.Pairs("authorization", "Bearer "+c.Token)
	}
	dial := checkedDial(c.URL, c.AllowRemote, c.Timeout)
	for range n {
		conn, err := grpc.NewClient(u.Host,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return dial(ctx, "tcp", addr) }),
			// A batch of 1,000 decisions of 16 limits each is about 3 MB.
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(8<<20)),
		)
		if err != nil {
			t.Close()
			return nil, fmt.Errorf("target %s: %w", c.URL, err)
		}
		t.conns = append(t.conns, conn)
	}
	return t, nil
}

func (t *grpcTarget) Describe() string {
	switch {
	case t.envoy:
		return fmt.Sprintf("envoy://%s ShouldRateLimit, domain %q, descriptor %s=KEY", t.addr, t.domain, t.descriptor)
	case t.batch > 1:
		return fmt.Sprintf("grpc://%s sluice.v1 TakeBatch, policy %q", t.addr, t.policy)
	}
	return fmt.Sprintf("grpc://%s sluice.v1 Take, policy %q", t.addr, t.policy)
}

func (t *grpcTarget) Close() error {
	for _, c := range t.conns {
		c.Close()
	}
	return nil
}

func (t *grpcTarget) outgoing(ctx context.Context) context.Context {
	if t.md == nil {
		return ctx
	}
	return metadata.NewOutgoingContext(ctx, t.md)
}

// codeName is the canonical name of a code, as the proto spells it:
// UNAVAILABLE, DEADLINE_EXCEEDED.
func codeName(c codes.Code) string {
	var b strings.Builder
	for i, r := range c.String() {
		if i > 0 && unicode.IsUpper(r) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToUpper(r))
	}
	return b.String()
}

// degraded reports a status that is the service's degraded denial.
func degraded(st *status.Status) bool {
	if st.Code() != codes.Unavailable {
		return false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == reasonDegradedDenial {
			return true
		}
	}
	return false
}

// statusResult is the Result of a take answered with st.
func statusResult(st *status.Status) Result {
	switch {
	case degraded(st):
		return Result{Outcome: Denied, Degraded: true}
	case st.Code() == codes.DeadlineExceeded:
		return fail(kindTimeout, st.Message())
	case st.Code() == codes.Canceled:
		return fail("canceled", st.Message())
	}
	return fail("grpc "+codeName(st.Code()), st.Message())
}

func (t *grpcTarget) Check(ctx context.Context, key string, cost int64) error {
	ctx = t.outgoing(ctx)
	conn := t.conns[0]
	if t.envoy {
		return t.checkEnvoy(ctx, conn, key, cost)
	}
	_, err := sluicev1.NewRateLimiterClient(conn).Peek(ctx, &sluicev1.PeekRequest{Policy: t.policy, Key: key, Cost: cost})
	if err == nil {
		return nil
	}
	st := status.Convert(err)
	switch {
	case degraded(st):
		return nil // a degraded decision: the service answers
	case st.Code() == codes.NotFound:
		return fmt.Errorf("the service at %s has no policy %q: %s", t.addr, t.policy, st.Message())
	}
	return t.checkError(st, "a sluice.v1 Peek of policy "+fmt.Sprintf("%q", t.policy))
}

// checkError says what a failed check's status means.
func (t *grpcTarget) checkError(st *status.Status, what string) error {
	switch st.Code() {
	case codes.Unauthenticated:
		if t.md == nil {
			return fmt.Errorf("the service at %s requires a bearer token: name the environment variable holding it with -token-env", t.addr)
		}
		return fmt.Errorf("the service at %s refused the bearer token: %s", t.addr, st.Message())
	case codes.Unimplemented:
		return fmt.Errorf("%s at %s is not implemented there: is it the gRPC listener of a sluice service (listen.grpc)? %s", what, t.addr, st.Message())
	case codes.Unavailable, codes.DeadlineExceeded:
		return fmt.Errorf("cannot reach the service at %s: %s", t.addr, st.Message())
	}
	return fmt.Errorf("the service at %s answered %s with %s: %s", t.addr, what, codeName(st.Code()), st.Message())
}

func (t *grpcTarget) envoyRequest(key string, cost int64) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{
		Domain: t.domain,
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: t.descriptor, Value: key}},
		}},
		HitsAddend: uint32(cost),
	}
}

// checkEnvoy sends a descriptor of hits_addend 0, which the service
// decides as a peek, and makes sure a rule with a limit matched it: a
// descriptor no rule matches is answered OK without a take, and a load of
// those would measure nothing.
func (t *grpcTarget) checkEnvoy(ctx context.Context, conn *grpc.ClientConn, key string, cost int64) error {
	if cost > math.MaxUint32 {
		return fmt.Errorf("%w: cost %d: Envoy's hits_addend is at most %d", sluice.ErrInvalidOption, cost, uint32(math.MaxUint32))
	}
	req := t.envoyRequest(key, 1)
	req.Descriptors[0].HitsAddend = wrapperspb.UInt64(0)
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req)
	if err != nil {
		return t.checkError(status.Convert(err), "ShouldRateLimit")
	}
	var lim *rlsv3.RateLimitResponse_RateLimit
	if s := resp.GetStatuses(); len(s) == 1 {
		lim = s[0].GetCurrentLimit()
	}
	if lim == nil {
		return fmt.Errorf("no rule with a limit matches domain %q, descriptor %s=%s at %s (an unknown domain, no rule for the key, or an unlimited rule): every request would be allowed without a take; name a rule of the service's envoy.config, keyed by %s with no value", t.domain, t.descriptor, key, t.addr, t.descriptor)
	}
	if uint64(cost) > uint64(lim.GetRequestsPerUnit()) {
		return fmt.Errorf("%w: cost %d is above the rule's requests_per_unit (%d): every such request would be OVER_LIMIT", sluice.ErrInvalidOption, cost, lim.GetRequestsPerUnit())
	}
	return nil
}

func (t *grpcTarget) Sender(i int) Sender {
	conn := t.conns[i%len(t.conns)]
	if t.envoy {
		return &envoySender{t: t, rls: rlsv3.NewRateLimitServiceClient(conn)}
	}
	s := &grpcSender{t: t, api: sluicev1.NewRateLimiterClient(conn)}
	if t.batch > 1 {
		s.items = make([]sluicev1.TakeRequest, t.batch)
		s.batch.Requests = make([]*sluicev1.TakeRequest, t.batch)
		for j := range s.items {
			s.batch.Requests[j] = &s.items[j]
		}
	}
	return s
}

type grpcSender struct {
	t     *grpcTarget
	api   sluicev1.RateLimiterClient
	take  sluicev1.TakeRequest
	items []sluicev1.TakeRequest
	batch sluicev1.TakeBatchRequest
}

// Send sends a Take or a TakeBatch. gRPC decodes the answer within the
// call, so its latency ends when the call returns.
func (s *grpcSender) Send(ctx context.Context, items []Item, out []Result) time.Time {
	s.send(ctx, items, out)
	return time.Time{}
}

func (s *grpcSender) send(ctx context.Context, items []Item, out []Result) {
	ctx = s.t.outgoing(ctx)
	if s.t.batch == 1 {
		s.take.Policy, s.take.Key, s.take.Cost = s.t.policy, items[0].Key, items[0].Cost
		d, err := s.api.Take(ctx, &s.take)
		if err != nil {
			out[0] = statusResult(status.Convert(err))
			return
		}
		out[0] = decisionResult(d)
		return
	}
	for j, it := range items {
		s.items[j].Policy, s.items[j].Key, s.items[j].Cost = s.t.policy, it.Key, it.Cost
	}
	resp, err := s.api.TakeBatch(ctx, &s.batch)
	if err != nil {
		setAll(out, statusResult(status.Convert(err)))
		return
	}
	rs := resp.GetResults()
	if len(rs) != len(items) {
		setAll(out, fail("bad answer", fmt.Sprintf("TakeBatch answered %d results for %d takes", len(rs), len(items))))
		return
	}
	for j, r := range rs {
		switch {
		case r.GetDecision() != nil:
			out[j] = decisionResult(r.GetDecision())
		case r.GetError() != nil:
			out[j] = statusResult(status.FromProto(r.GetError()))
		default:
			out[j] = fail("bad answer", "a TakeBatch result is neither a decision nor an error")
		}
	}
}

func decisionResult(d *sluicev1.Decision) Result {
	if d.GetAllowed() {
		return Result{Outcome: Allowed, Degraded: d.GetDegraded(), ShadowDenied: d.GetShadowDenied()}
	}
	return Result{Outcome: Denied, Degraded: d.GetDegraded()}
}

type envoySender struct {
	t   *grpcTarget
	rls rlsv3.RateLimitServiceClient
	req *rlsv3.RateLimitRequest
}

// Send sends a ShouldRateLimit; its latency ends when the call returns.
func (s *envoySender) Send(ctx context.Context, items []Item, out []Result) time.Time {
	s.send(ctx, items, out)
	return time.Time{}
}

func (s *envoySender) send(ctx context.Context, items []Item, out []Result) {
	if s.req == nil {
		s.req = s.t.envoyRequest(items[0].Key, items[0].Cost)
	}
	s.req.Descriptors[0].Entries[0].Value = items[0].Key
	s.req.HitsAddend = uint32(items[0].Cost)
	resp, err := s.rls.ShouldRateLimit(s.t.outgoing(ctx), s.req)
	if err != nil {
		out[0] = statusResult(status.Convert(err))
		return
	}
	deg := false
	for _, h := range resp.GetRequestHeadersToAdd() {
		if strings.EqualFold(h.GetKey(), degradedHeader) && h.GetValue() == "true" {
			deg = true
		}
	}
	switch resp.GetOverallCode() {
	case rlsv3.RateLimitResponse_OVER_LIMIT:
		out[0] = Result{Outcome: Denied, Degraded: deg}
	case rlsv3.RateLimitResponse_OK:
		if st := resp.GetStatuses(); len(st) != 1 || st[0].GetCurrentLimit() == nil {
			// No rule with a limit matched (or an unlimited one): OK
			// without a take.
			out[0] = fail("no rule", fmt.Sprintf("no rule with a limit matched %s=%s: allowed without a take", s.t.descriptor, items[0].Key))
			return
		}
		out[0] = Result{Outcome: Allowed, Degraded: deg}
	default:
		out[0] = fail("envoy "+resp.GetOverallCode().String(), "the overall code is neither OK nor OVER_LIMIT")
	}
}
