package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// maxAnswer bounds the message of an answer: a batch of 100,000 decisions
// of the longest policies is some 20 MB.
const maxAnswer = 64 << 20

// generator makes the calls of a config. Its connections live across runs
// (a warm-up, then the measured run).
type generator struct {
	c config
	// ctx is the parent of every call's context: it carries the bearer
	// token, if any.
	ctx     context.Context
	conns   []*grpc.ClientConn
	callers []caller // one per call slot
}

// newGenerator connects to the service, waiting (at most the call timeout,
// or until ctx ends) until every connection is up, so that no call of a
// run pays for a connection's set-up.
func newGenerator(ctx context.Context, c config) (*generator, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	g := &generator{c: c, ctx: context.Background()}
	if c.token != "" {
		g.ctx = metadata.AppendToOutgoingContext(g.ctx, "authorization", "Bearer "+c.token)
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxAnswer)),
	}
	if c.client == "raw" {
		opts = append(opts, grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})))
	}
	for range c.conns {
		// Each ClientConn has a transport, one HTTP/2 connection, of its
		// own: connections are never shared between ClientConns.
		conn, err := grpc.NewClient("passthrough:///"+c.addr, opts...)
		if err != nil {
			g.close()
			return nil, fmt.Errorf("-addr %q: %w", c.addr, err)
		}
		g.conns = append(g.conns, conn)
	}
	wait, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	for _, conn := range g.conns {
		if err := ready(wait, conn); err != nil {
			g.close()
			return nil, fmt.Errorf("connecting to %s: %w", c.addr, err)
		}
	}
	keys := make([]string, c.keys)
	for i := range keys {
		keys[i] = keyName(i)
	}
	var bodies [][]byte // the raw client's request, or batch item, of each key
	if c.client == "raw" {
		bodies = make([][]byte, c.keys)
		for i, k := range keys {
			var m proto.Message = &sluicev1.TakeRequest{Policy: c.policy, Key: k}
			if c.mode == "envoy" {
				m = envoyRequest(c, k)
			}
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
			if err != nil {
				return nil, err
			}
			bodies[i] = b
		}
	}
	for i := range c.inFlight {
		conn := g.conns[i%len(g.conns)]
		var cl caller
		switch {
		case c.client == "raw":
			cl = &rawCaller{conn: conn, mode: c.mode, batch: c.batch, bodies: bodies}
		case c.mode == "take":
			cl = &takeCaller{client: sluicev1.NewRateLimiterClient(conn), keys: keys, req: &sluicev1.TakeRequest{Policy: c.policy}}
		case c.mode == "batch":
			b := &batchCaller{client: sluicev1.NewRateLimiterClient(conn), keys: keys, req: &sluicev1.TakeBatchRequest{}}
			for range c.batch {
				b.req.Requests = append(b.req.Requests, &sluicev1.TakeRequest{Policy: c.policy})
			}
			cl = b
		default:
			e := &envoyCaller{client: rlsv3.NewRateLimitServiceClient(conn), keys: keys, req: envoyRequest(c, "")}
			e.entry = e.req.Descriptors[0].Entries[0]
			cl = e
		}
		g.callers = append(g.callers, cl)
	}
	return g, nil
}

// ready connects conn and waits until it is up.
func ready(ctx context.Context, conn *grpc.ClientConn) error {
	conn.Connect()
	for {
		switch s := conn.GetState(); s {
		case connectivity.Ready:
			return nil
		case connectivity.Shutdown:
			return errors.New("the connection was closed")
		default:
			if !conn.WaitForStateChange(ctx, s) {
				return fmt.Errorf("still %v: %w", s, ctx.Err())
			}
		}
	}
}

// close closes the connections.
func (g *generator) close() {
	for _, conn := range g.conns {
		conn.Close()
	}
}

// envoyRequest is the ShouldRateLimit request of key.
func envoyRequest(c config, key string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: c.domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: c.descriptor, Value: key}},
	}}}
}

// codeOf is the gRPC code of a call's error.
func codeOf(err error) codes.Code { return status.Code(err) }

// takeCaller makes Take calls with the generated messages.
type takeCaller struct {
	client sluicev1.RateLimiterClient
	keys   []string
	req    *sluicev1.TakeRequest
}

func (t *takeCaller) call(ctx context.Context, rng *rand.Rand, r *report) {
	t.req.Key = t.keys[rng.IntN(len(t.keys))]
	d, err := t.client.Take(ctx, t.req)
	if err != nil {
		r.fail(1, err)
		return
	}
	r.count(d.GetAllowed())
}

// batchCaller makes TakeBatch calls with the generated messages.
type batchCaller struct {
	client sluicev1.RateLimiterClient
	keys   []string
	req    *sluicev1.TakeBatchRequest
}

func (b *batchCaller) call(ctx context.Context, rng *rand.Rand, r *report) {
	for _, t := range b.req.Requests {
		t.Key = b.keys[rng.IntN(len(b.keys))]
	}
	n := int64(len(b.req.Requests))
	resp, err := b.client.TakeBatch(ctx, b.req)
	if err != nil {
		r.fail(n, err)
		return
	}
	if got := int64(len(resp.GetResults())); got != n {
		r.bad(n, fmt.Sprintf("%d results for %d takes", got, n))
		return
	}
	for i, res := range resp.GetResults() {
		switch {
		case res.GetDecision() != nil:
			r.count(res.GetDecision().GetAllowed())
		case res.GetError() != nil:
			r.itemError(codes.Code(res.GetError().GetCode()), fmt.Sprintf("result %d: %s: %s", i, codes.Code(res.GetError().GetCode()), res.GetError().GetMessage()))
		default:
			r.bad(1, fmt.Sprintf("result %d is neither a decision nor an error", i))
		}
	}
}

// itemError counts a batch item answered with an error status.
func (r *report) itemError(c codes.Code, msg string) {
	r.codes[c]++
	r.bad(1, msg)
}

// envoyCaller makes ShouldRateLimit calls with the generated messages.
type envoyCaller struct {
	client rlsv3.RateLimitServiceClient
	keys   []string
	req    *rlsv3.RateLimitRequest
	entry  *ratelimitv3.RateLimitDescriptor_Entry // the one entry of req, whose value is the key
}

func (e *envoyCaller) call(ctx context.Context, rng *rand.Rand, r *report) {
	e.entry.Value = e.keys[rng.IntN(len(e.keys))]
	resp, err := e.client.ShouldRateLimit(ctx, e.req)
	if err != nil {
		r.fail(1, err)
		return
	}
	r.envoy(envoyAnswerOf(resp))
}

// envoyAnswerOf is what the generator reads of resp.
func envoyAnswerOf(resp *rlsv3.RateLimitResponse) envoyAnswer {
	a := envoyAnswer{overall: resp.GetOverallCode(), statuses: len(resp.GetStatuses())}
	if a.statuses > 0 {
		a.code, a.matched = resp.GetStatuses()[0].GetCode(), resp.GetStatuses()[0].GetCurrentLimit() != nil
	}
	return a
}

// envoyAnswer is what the generator reads of a ShouldRateLimit answer.
type envoyAnswer struct {
	overall  rlsv3.RateLimitResponse_Code
	statuses int
	code     rlsv3.RateLimitResponse_Code // of the first status
	matched  bool                         // the first status has a current_limit: a rule matched
}

// envoy counts the answer to one descriptor.
func (r *report) envoy(a envoyAnswer) {
	switch {
	case a.statuses != 1:
		r.bad(1, fmt.Sprintf("%d statuses for 1 descriptor", a.statuses))
	case a.code != a.overall:
		r.bad(1, fmt.Sprintf("overall code %v, but the descriptor's is %v", a.overall, a.code))
	case a.overall == rlsv3.RateLimitResponse_OK && !a.matched:
		r.unmatched++
		r.bad(1, "no rule matched the descriptor (an OK without a current_limit)")
	case a.overall == rlsv3.RateLimitResponse_OK:
		r.count(true)
	case a.overall == rlsv3.RateLimitResponse_OVER_LIMIT:
		r.count(false)
	default:
		r.bad(1, fmt.Sprintf("overall code %v", a.overall))
	}
}

// rawCaller makes the calls of any mode with requests encoded once per
// key (a batch is the concatenation of its items), and reads the answers
// with answer.go's decoders, which read only what is counted: the
// generated messages' Marshal and Unmarshal, and their allocations, cost
// CPU time that the service on the same machine gets instead.
type rawCaller struct {
	conn   *grpc.ClientConn
	mode   string
	batch  int
	bodies [][]byte // the encoded request (take, envoy) or TakeRequest (batch) of each key
	req    rawMessage
	resp   rawMessage
	outs   []outcome
}

func (c *rawCaller) call(ctx context.Context, rng *rand.Rand, r *report) {
	var method string
	switch c.mode {
	case "take":
		method = sluicev1.RateLimiter_Take_FullMethodName
		c.req.b = c.bodies[rng.IntN(len(c.bodies))]
	case "envoy":
		method = rlsv3.RateLimitService_ShouldRateLimit_FullMethodName
		c.req.b = c.bodies[rng.IntN(len(c.bodies))]
	default:
		method = sluicev1.RateLimiter_TakeBatch_FullMethodName
		// A new buffer each time: the transport may hold the last one
		// until it is written, even after its answer is in.
		var b []byte
		if c.req.b != nil {
			b = make([]byte, 0, cap(c.req.b))
		}
		for range c.batch {
			b = appendItem(b, c.bodies[rng.IntN(len(c.bodies))])
		}
		c.req.b = b
	}
	if err := c.conn.Invoke(ctx, method, &c.req, &c.resp); err != nil {
		n := int64(1)
		if c.mode == "batch" {
			n = int64(c.batch)
		}
		r.fail(n, err)
		return
	}
	switch c.mode {
	case "take":
		allowed, err := readDecision(c.resp.b)
		if err != nil {
			r.bad(1, fmt.Sprintf("answer %x is not a Decision: %v", trim(c.resp.b), err))
			return
		}
		r.count(allowed)
	case "envoy":
		a, err := readEnvoy(c.resp.b)
		if err != nil {
			r.bad(1, fmt.Sprintf("answer %x is not a RateLimitResponse: %v", trim(c.resp.b), err))
			return
		}
		r.envoy(a)
	default:
		outs, err := readBatch(c.resp.b, c.outs)
		c.outs = outs
		if err != nil || len(outs) != c.batch {
			r.bad(int64(c.batch), fmt.Sprintf("answer %x is not %d results: %v", trim(c.resp.b), c.batch, err))
			return
		}
		for i, o := range outs {
			if o.decided {
				r.count(o.allowed)
			} else {
				r.itemError(o.code, fmt.Sprintf("result %d: %v", i, o.code))
			}
		}
	}
}

// appendItem appends an encoded TakeRequest to an encoded
// TakeBatchRequest, as an element of its field 1, requests.
func appendItem(batch, item []byte) []byte {
	batch = protowire.AppendTag(batch, 1, protowire.BytesType)
	return protowire.AppendBytes(batch, item)
}

// trim shortens an answer for an error message.
func trim(b []byte) []byte { return b[:min(len(b), 100)] }

// rawMessage is a message as its encoded bytes, for rawCodec.
type rawMessage struct{ b []byte }

// rawCodec sends a rawMessage's bytes as they are, and copies an answer's
// into one, reusing its buffer.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(*rawMessage)
	if !ok {
		return nil, fmt.Errorf("rawCodec: cannot send a %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(m.b)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*rawMessage)
	if !ok {
		return fmt.Errorf("rawCodec: cannot read into a %T", v)
	}
	m.b = m.b[:0]
	for _, b := range data {
		m.b = append(m.b, b.ReadOnlyData()...)
	}
	return nil
}

// Name is that of the proto codec: the service reads the requests with
// it.
func (rawCodec) Name() string { return "proto" }
