package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/gubernator-io/gubernator/v2"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/bench/internal/rawhttp"
)

// The cells of the comparison: a transport, and one decision a call or a
// batch of them.
const (
	cellHTTPSingle = "http-single"
	cellGRPCSingle = "grpc-single"
	cellHTTPBatch  = "http-batch"
	cellGRPCBatch  = "grpc-batch"
)

var allCells = []string{cellHTTPSingle, cellGRPCSingle, cellHTTPBatch, cellGRPCBatch}

// The calls of each server and cell.
const (
	sluiceTakePath       = "/v1/take"
	sluiceBatchPath      = "/v1/take:batch"
	gubernatorHTTPPath   = "/v1/GetRateLimits"
	gubernatorGRPCMethod = gubernator.V1_GetRateLimits_FullMethodName
)

// policyName is the sluice policy and the gubernator rate-limit name of
// every decision.
const policyName = "bench"

// maxGRPCAnswer bounds the message of a gRPC answer.
const maxGRPCAnswer = 64 << 20

// workload is what every run of a comparison asks for, of either server.
type workload struct {
	inFlight int
	conns    int // gRPC connections the calls in flight are spread over
	keys     int
	batch    int // decisions of a batch call
	timeout  time.Duration
	gub      gubernatorLimit
}

// perCall is the number of decisions one call of cell asks for.
func (w workload) perCall(cell string) int {
	if cell == cellHTTPBatch || cell == cellGRPCBatch {
		return w.batch
	}
	return 1
}

// keyName is the name of key i.
func keyName(i int) string { return "k" + strconv.Itoa(i) }

// target makes the calls of one cell against one server. Its connections
// live across runs (a warm-up, then the measured run).
type target struct {
	per     int
	callers []caller // one per call slot
	close   func()
}

// A caller makes the calls of one slot.
type caller interface {
	// call makes one call for keys drawn from rng and returns the
	// outcome of each decision asked for, in order, or an error if there
	// was no usable answer (then every decision is an error).
	call(ctx context.Context, rng *rand.Rand) ([]outcome, error)
}

// newTarget connects to srv for the calls of cell.
func newTarget(ctx context.Context, srv *server, cell string, w workload) (*target, error) {
	t := &target{per: w.perCall(cell)}
	// items are the encoded request of one decision for each key: a body
	// (HTTP) or message (gRPC) of its own for single sluice takes, an
	// element of the list of the call's body or message otherwise.
	items := make([][]byte, w.keys)
	for i := range items {
		b, err := encodeItem(srv.name, cell, keyName(i), w.gub)
		if err != nil {
			return nil, err
		}
		items[i] = b
	}
	switch cell {
	case cellHTTPSingle, cellHTTPBatch:
		var path string
		var list listBody
		var read func([]byte, []outcome) ([]outcome, error)
		switch {
		case srv.name == sluiceServer && cell == cellHTTPSingle:
			path, read = sluiceTakePath, readSluiceDecision
		case srv.name == sluiceServer:
			path, read, list = sluiceBatchPath, readSluiceBatch, listBody{`{"requests":[`, `]}`}
		default:
			path, read, list = gubernatorHTTPPath, readGubernatorJSON, listBody{`{"requests":[`, `]}`}
		}
		u, err := url.Parse(srv.httpURL + path)
		if err != nil {
			return nil, fmt.Errorf("%s: HTTP URL %q: %w", srv.name, srv.httpURL, err)
		}
		var senders []*rawhttp.Sender
		for range w.inFlight {
			s := rawhttp.New(u, "", w.timeout)
			senders = append(senders, s)
			t.callers = append(t.callers, &httpCaller{s: s, items: items, per: t.per, list: list, read: read})
		}
		t.close = func() {
			for _, s := range senders {
				s.Close()
			}
		}
	case cellGRPCSingle, cellGRPCBatch:
		var method string
		var read func([]byte, []outcome) ([]outcome, error)
		wrap := true
		switch {
		case srv.name == sluiceServer && cell == cellGRPCSingle:
			method, read, wrap = sluicev1.RateLimiter_Take_FullMethodName, readTakeProto, false
		case srv.name == sluiceServer:
			method, read = sluicev1.RateLimiter_TakeBatch_FullMethodName, readTakeBatchProto
		default:
			method, read = gubernatorGRPCMethod, readGubernatorProto
		}
		conns, err := dialAll(ctx, srv.grpcAddr, w)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", srv.name, err)
		}
		for i := range w.inFlight {
			t.callers = append(t.callers, &grpcCaller{conn: conns[i%len(conns)], method: method, items: items, per: t.per, wrap: wrap, read: read})
		}
		t.close = func() {
			for _, c := range conns {
				c.Close()
			}
		}
	default:
		return nil, fmt.Errorf("cell %q: want one of %v", cell, allCells)
	}
	return t, nil
}

// encodeItem is the encoded request of one decision on key: JSON for the
// HTTP cells, the protobuf wire format for the gRPC ones.
func encodeItem(srvName, cell, key string, g gubernatorLimit) ([]byte, error) {
	httpCell := cell == cellHTTPSingle || cell == cellHTTPBatch
	switch {
	case srvName == sluiceServer && httpCell:
		return fmt.Appendf(nil, `{"policy":%q,"key":%q}`, policyName, key), nil
	case srvName == sluiceServer:
		return proto.MarshalOptions{Deterministic: true}.Marshal(&sluicev1.TakeRequest{Policy: policyName, Key: key})
	case httpCell:
		// grpc-gateway's JSON: int64 fields as strings, enums by name.
		return fmt.Appendf(nil, `{"name":%q,"unique_key":%q,"hits":"1","limit":"%d","duration":"%d","algorithm":%q,"burst":"%d"}`,
			policyName, key, g.limit, g.duration.Milliseconds(), g.algorithm.String(), g.burst), nil
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(&gubernator.RateLimitReq{
		Name: policyName, UniqueKey: key, Hits: 1, Limit: g.limit, Duration: g.duration.Milliseconds(),
		Algorithm: g.algorithm, Burst: g.burst,
	})
}

// listBody is the JSON around the items of a batch body; the zero value
// for a body that is one item.
type listBody struct{ prefix, suffix string }

// httpCaller posts a body of per items of random keys and reads the
// answer.
type httpCaller struct {
	s     *rawhttp.Sender
	items [][]byte
	per   int
	list  listBody
	read  func([]byte, []outcome) ([]outcome, error)
	body  []byte // the body of the call: an item, or batchBody
	// batchBody is the buffer of batch bodies.
	batchBody []byte
	buf       bytes.Buffer
	outs      []outcome
}

func (c *httpCaller) call(_ context.Context, rng *rand.Rand) ([]outcome, error) {
	if c.list.prefix == "" {
		c.body = c.items[rng.IntN(len(c.items))]
	} else {
		// The sender has written the last body before it returned, so
		// its buffer is free again.
		b := append(c.batchBody[:0], c.list.prefix...)
		for i := range c.per {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, c.items[rng.IntN(len(c.items))]...)
		}
		c.batchBody = append(b, c.list.suffix...)
		c.body = c.batchBody
	}
	c.buf.Reset()
	status, err := c.s.Send(c.body, &c.buf)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("status %d: %.200s", status, c.buf.Bytes())
	}
	outs, err := c.read(c.buf.Bytes(), c.outs)
	c.outs = outs
	if err != nil || len(outs) != c.per {
		return nil, fmt.Errorf("answer %.200q is not %d results: %v", c.buf.Bytes(), c.per, err)
	}
	return outs, nil
}

// grpcCaller invokes a method with a message of per items of random keys
// (or, unwrapped, the one item as the message) and reads the answer.
type grpcCaller struct {
	conn   *grpc.ClientConn
	method string
	items  [][]byte
	per    int
	wrap   bool
	read   func([]byte, []outcome) ([]outcome, error)
	req    rawMessage
	resp   rawMessage
	outs   []outcome
}

func (c *grpcCaller) call(ctx context.Context, rng *rand.Rand) ([]outcome, error) {
	if !c.wrap {
		c.req.b = c.items[rng.IntN(len(c.items))]
	} else {
		// A new buffer each time: the transport may hold the last one
		// until it is written, even after its answer is in.
		b := make([]byte, 0, cap(c.req.b))
		for range c.per {
			b = appendItem(b, c.items[rng.IntN(len(c.items))])
		}
		c.req.b = b
	}
	if err := c.conn.Invoke(ctx, c.method, &c.req, &c.resp); err != nil {
		return nil, err
	}
	outs, err := c.read(c.resp.b, c.outs)
	c.outs = outs
	if err != nil || len(outs) != c.per {
		return nil, fmt.Errorf("answer %x is not %d results: %v", c.resp.b[:min(len(c.resp.b), 100)], c.per, err)
	}
	return outs, nil
}

// dialAll opens w.conns gRPC connections to addr, each a ClientConn (an
// HTTP/2 connection) of its own, and waits until each is up.
func dialAll(ctx context.Context, addr string, w workload) ([]*grpc.ClientConn, error) {
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxGRPCAnswer), grpc.ForceCodecV2(rawCodec{})),
	}
	var conns []*grpc.ClientConn
	closeAll := func() {
		for _, c := range conns {
			c.Close()
		}
	}
	wait, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	for range w.conns {
		conn, err := grpc.NewClient("passthrough:///"+addr, opts...)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("gRPC address %q: %w", addr, err)
		}
		conns = append(conns, conn)
		if err := ready(wait, conn); err != nil {
			closeAll()
			return nil, fmt.Errorf("connecting to %s: %w", addr, err)
		}
	}
	return conns, nil
}

// ready connects conn and waits until it is up.
func ready(ctx context.Context, conn *grpc.ClientConn) error {
	conn.Connect()
	for {
		switch s := conn.GetState(); s {
		case connectivity.Ready:
			return nil
		case connectivity.Shutdown:
			return fmt.Errorf("the connection was closed")
		default:
			if !conn.WaitForStateChange(ctx, s) {
				return fmt.Errorf("still %v: %w", s, ctx.Err())
			}
		}
	}
}

// rawMessage is a message as its encoded bytes, for rawCodec.
type rawMessage struct{ b []byte }

// rawCodec sends a rawMessage's bytes as they are, and copies an answer's
// into one, reusing its buffer (bench/grpc's codec).
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

// Name is that of the proto codec: the servers read the requests with it.
func (rawCodec) Name() string { return "proto" }

// report is the outcome of one run of a target.
type report struct {
	calls     int64 // made, answered or not
	decisions int64 // asked for: allowed + denied + errors
	allowed   int64
	denied    int64
	errors    int64 // decisions without a decision: a failed call, or an item that failed
	failed    int64 // calls without a usable answer
	firstErr  string
	elapsed   time.Duration
	cpu       time.Duration // of this process over the run
	latencies []time.Duration
}

// bad counts decisions that were not made.
func (r *report) bad(decisions int64, msg string) {
	r.errors += decisions
	if r.firstErr == "" {
		r.firstErr = msg
	}
}

// run makes calls for d, or until n calls were made if n > 0, each slot's
// keys drawn from a PCG seeded with seed and the slot's index, so that
// every server of a round is asked for the same keys in the same order.
// It returns an error if ctx ends, or if not one decision was made.
func (t *target) run(ctx context.Context, d time.Duration, n int64, seed uint64, timeout time.Duration) (report, error) {
	var stop atomic.Bool
	var made atomic.Int64
	if n == 0 {
		tm := time.AfterFunc(d, func() { stop.Store(true) })
		defer tm.Stop()
	}
	cancel := context.AfterFunc(ctx, func() { stop.Store(true) })
	defer cancel()

	per := int64(t.per)
	reports := make([]report, len(t.callers))
	cpu0 := cpuTime()
	start := time.Now()
	var wg sync.WaitGroup
	for i, c := range t.callers {
		r := &reports[i]
		rng := rand.New(rand.NewPCG(seed, uint64(i)))
		wg.Go(func() {
			for !stop.Load() && (n == 0 || made.Add(1) <= n) {
				r.calls++
				r.decisions += per
				callCtx, cancel := context.WithTimeout(ctx, timeout)
				t0 := time.Now()
				outs, err := c.call(callCtx, rng)
				r.latencies = append(r.latencies, time.Since(t0))
				cancel()
				if err != nil {
					r.failed++
					r.bad(per, err.Error())
					continue
				}
				for j, o := range outs {
					switch {
					case !o.decided:
						r.bad(1, fmt.Sprintf("item %d of a call failed", j))
					case o.allowed:
						r.allowed++
					default:
						r.denied++
					}
				}
			}
		})
	}
	wg.Wait()
	sum := report{elapsed: time.Since(start), cpu: cpuTime() - cpu0}
	for _, r := range reports {
		sum.calls += r.calls
		sum.decisions += r.decisions
		sum.allowed += r.allowed
		sum.denied += r.denied
		sum.errors += r.errors
		sum.failed += r.failed
		if sum.firstErr == "" {
			sum.firstErr = r.firstErr
		}
		sum.latencies = append(sum.latencies, r.latencies...)
	}
	slices.Sort(sum.latencies)
	if err := ctx.Err(); err != nil {
		return sum, err
	}
	if sum.allowed+sum.denied == 0 {
		return sum, fmt.Errorf("no decision in %d calls (first error: %s)", sum.calls, sum.firstErr)
	}
	return sum, nil
}

// cpuTime returns the user and system CPU time of this process.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// percentile returns the p-th percentile (0 < p <= 1) of sorted latencies,
// nearest rank; 0 for none.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
