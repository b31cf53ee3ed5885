// Package grpcapi is the gRPC API of the Sluice service, sluice.v1.RateLimiter
// (proto/sluice/v1/sluice.proto, generated into api/sluice/v1): it checks a
// request, asks the service core, and converts the decision. It decides
// nothing itself, and answers as the HTTP JSON API (internal/httpapi) does:
//
//	Take, Peek, Drain, Refund  → a Decision, allowed or denied (OK)
//	TakeBatch                  → one Decision or google.rpc.Status per request, in order
//	Reset                      → ResetResponse
//
// A denial is an OK answer with allowed false. A degraded denial (the store
// could not be asked and the failure mode denies) is UNAVAILABLE, never
// RESOURCE_EXHAUSTED: an outage is not a quota. Bad input is
// INVALID_ARGUMENT with a google.rpc.BadRequest naming the field, an unknown
// policy NOT_FOUND, a request ID reused with another cost or unknown to a
// refund FAILED_PRECONDITION, and a missing or wrong bearer token
// UNAUTHENTICATED. The proto file documents each answer for clients.
//
// Authentication is a pair of interceptors, Server.UnaryAuth and
// Server.StreamAuth, that the gRPC server must be built with; the health
// and reflection services are exempt, so that probes need no token.
package grpcapi

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/httpapi"
	"github.com/sluicehq/sluice/internal/service"
)

// DefaultMaxBatch is the default bound on the requests of one TakeBatch:
// the HTTP API's, so that a client may move a batch between the two.
const DefaultMaxBatch = httpapi.DefaultMaxBatch

// Options configure a Server. The zero value of each field means its
// documented default.
type Options struct {
	// Tokens are the accepted bearer tokens; none means no authentication.
	// They are compared in constant time and never logged.
	Tokens []string
	// MaxBatch bounds the requests of one TakeBatch. Default
	// DefaultMaxBatch (1,000). The server's receive limit bounds a batch
	// too: a request of the longest policy, key and request ID (64, 512
	// and 512 bytes) is about 1.1 KB, so 1,000 of them need about 1.1 MB.
	MaxBatch int
	// Logger receives one line per request that failed for a reason other
	// than the client's input (store errors). Default: discard.
	Logger *slog.Logger
}

// Server implements sluicev1.RateLimiterServer over a service.Core. Create
// one with New.
type Server struct {
	sluicev1.UnimplementedRateLimiterServer

	core     *service.Core
	tokens   config.Bearer
	maxBatch int
	log      *slog.Logger
}

// New returns a Server for core. The error wraps sluice.ErrInvalidOption.
func New(core *service.Core, o Options) (*Server, error) {
	if core == nil {
		return nil, fmt.Errorf("%w: core is nil", sluice.ErrInvalidOption)
	}
	s := &Server{core: core, maxBatch: o.MaxBatch, log: o.Logger}
	switch {
	case s.maxBatch == 0:
		s.maxBatch = DefaultMaxBatch
	case s.maxBatch < 0:
		return nil, fmt.Errorf("%w: MaxBatch %d is negative", sluice.ErrInvalidOption, s.maxBatch)
	}
	var err error
	if s.tokens, err = config.NewBearer(o.Tokens); err != nil {
		return nil, err
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	return s, nil
}

// Register registers the RateLimiter service on r, a *grpc.Server. Build
// that server with the interceptors UnaryAuth and StreamAuth, or the
// service answers without asking for a token.
func (s *Server) Register(r grpc.ServiceRegistrar) {
	sluicev1.RegisterRateLimiterServer(r, s)
}

// Take implements sluicev1.RateLimiterServer.
func (s *Server) Take(ctx context.Context, req *sluicev1.TakeRequest) (*sluicev1.Decision, error) {
	return s.decide(ctx, sluicev1.RateLimiter_Take_FullMethodName, s.core.Take, serviceRequest(req))
}

// Peek implements sluicev1.RateLimiterServer.
func (s *Server) Peek(ctx context.Context, req *sluicev1.PeekRequest) (*sluicev1.Decision, error) {
	r := service.Request{Policy: req.GetPolicy(), Key: req.GetKey(), Cost: cost(req.GetCost())}
	return s.decide(ctx, sluicev1.RateLimiter_Peek_FullMethodName, s.core.Peek, r)
}

// Drain implements sluicev1.RateLimiterServer.
func (s *Server) Drain(ctx context.Context, req *sluicev1.DrainRequest) (*sluicev1.Decision, error) {
	r := service.Request{Policy: req.GetPolicy(), Key: req.GetKey(), Cost: cost(req.GetCost())}
	return s.decide(ctx, sluicev1.RateLimiter_Drain_FullMethodName, s.core.Drain, r)
}

// Refund implements sluicev1.RateLimiterServer.
func (s *Server) Refund(ctx context.Context, req *sluicev1.RefundRequest) (*sluicev1.Decision, error) {
	r := service.Request{Policy: req.GetPolicy(), Key: req.GetKey(), Cost: cost(req.GetCost()), RequestID: req.GetRequestId()}
	return s.decide(ctx, sluicev1.RateLimiter_Refund_FullMethodName, s.core.Refund, r)
}

// Reset implements sluicev1.RateLimiterServer.
func (s *Server) Reset(ctx context.Context, req *sluicev1.ResetRequest) (*sluicev1.ResetResponse, error) {
	const method = sluicev1.RateLimiter_Reset_FullMethodName
	if st := checkRequest(req.GetPolicy(), req.GetKey(), ""); st != nil {
		return nil, st.Err()
	}
	if _, err := s.core.Reset(ctx, req.GetPolicy(), req.GetKey()); err != nil {
		return nil, s.errorStatus(method, req.GetPolicy(), err, "").Err()
	}
	return &sluicev1.ResetResponse{}, nil
}

// TakeBatch implements sluicev1.RateLimiterServer: each request is decided
// as Take would, and its error is its own result. Only a bad batch, or the
// end of the call, fails the whole call.
func (s *Server) TakeBatch(ctx context.Context, req *sluicev1.TakeBatchRequest) (*sluicev1.TakeBatchResponse, error) {
	const method = sluicev1.RateLimiter_TakeBatch_FullMethodName
	reqs := req.GetRequests()
	if n := len(reqs); n == 0 || n > s.maxBatch {
		return nil, badRequest("requests", fmt.Sprintf("a batch holds 1 to %d requests, got %d", s.maxBatch, n)).Err()
	}
	out := &sluicev1.TakeBatchResponse{Results: make([]*sluicev1.TakeBatchResult, len(reqs))}
	for i, item := range reqs {
		// Nobody waits for the rest of the batch once the call has ended:
		// the call fails, rather than each remaining request one by one.
		if err := ctx.Err(); err != nil {
			return nil, status.FromContextError(err).Err()
		}
		prefix := "requests[" + strconv.Itoa(i) + "]."
		r := serviceRequest(item)
		var st *status.Status
		if st = checkRequest(r.Policy, r.Key, prefix); st == nil {
			res, err := s.core.Take(ctx, r)
			switch {
			case err != nil:
				st = s.errorStatus(method, r.Policy, err, prefix)
			case res.Degraded && !res.Allowed:
				st = degradedStatus(res)
			default:
				out.Results[i] = &sluicev1.TakeBatchResult{Result: &sluicev1.TakeBatchResult_Decision{Decision: decision(res)}}
				continue
			}
		}
		out.Results[i] = &sluicev1.TakeBatchResult{Result: &sluicev1.TakeBatchResult_Error{Error: st.Proto()}}
	}
	return out, nil
}

// decide answers one take, peek, drain or refund made by op.
func (s *Server) decide(ctx context.Context, method string, op func(context.Context, service.Request) (service.Result, error), r service.Request) (*sluicev1.Decision, error) {
	if st := checkRequest(r.Policy, r.Key, ""); st != nil {
		return nil, st.Err()
	}
	res, err := op(ctx, r)
	if err != nil {
		return nil, s.errorStatus(method, r.Policy, err, "").Err()
	}
	if res.Degraded && !res.Allowed {
		return nil, degradedStatus(res).Err()
	}
	return decision(res), nil
}

// serviceRequest is the core's request of a take.
func serviceRequest(req *sluicev1.TakeRequest) service.Request {
	return service.Request{Policy: req.GetPolicy(), Key: req.GetKey(), Cost: cost(req.GetCost()), RequestID: req.GetRequestId()}
}

// cost is the cost of a request: proto3 cannot tell a cost of 0 from none,
// and none means 1, as in the HTTP API.
func cost(c int64) int64 {
	if c == 0 {
		return 1
	}
	return c
}

// checkRequest checks what the core cannot tell from a wrong value: a
// missing policy (which it would call unknown) and a missing key. prefix
// goes before the field's name (a batch item's "requests[3].").
func checkRequest(policy, key, prefix string) *status.Status {
	switch {
	case policy == "":
		return badRequest(prefix+"policy", "policy is missing: name the policy of the bucket")
	case key == "":
		return badRequest(prefix+"key", "key is missing or empty")
	}
	return nil
}
