package main

import (
	"context"
	"log/slog"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/grpcapi"
	"github.com/sluicehq/sluice/internal/rls"
)

// The gRPC server's bounds. The largest request the API takes, a batch of
// 1,000 takes with the longest policies, keys and request IDs, is about
// 1.1 MB; the largest answer, 1,000 decisions of 16 limits each, about
// 3 MB. Keepalive pings more often than every 10 seconds are a client's
// mistake or an attack, and the connection is closed (ENHANCE_YOUR_CALM).
const (
	grpcMaxRecvBytes     = 2 << 20
	grpcMaxSendBytes     = 4 << 20
	grpcMaxStreams       = 1000
	grpcKeepaliveMinTime = 10 * time.Second
	grpcKeepaliveTime    = 2 * time.Minute
	grpcKeepaliveTimeout = 20 * time.Second
	grpcConnectionIdle   = 15 * time.Minute
)

// grpcServer is the gRPC listener's server: sluice.v1, Envoy's rate-limit
// service, health and reflection.
type grpcServer struct {
	srv    *grpc.Server
	health *health.Server
	// closing is closed when a shutdown begins: it ends the streams the
	// server holds open (a health Watch), which GracefulStop would
	// otherwise wait for until the drain time is over.
	closing   chan struct{}
	closeOnce sync.Once
}

// grpcServices are the services the health server reports on: "" (the
// server as a whole) and each API.
var grpcServices = []string{"", sluicev1.RateLimiter_ServiceDesc.ServiceName, rlsv3.RateLimitService_ServiceDesc.ServiceName}

// newGRPCServer builds the gRPC server over rt's core. Its health starts
// NOT_SERVING; setServing turns it on and off with the service's readiness.
func newGRPCServer(rt *runtime, reg prometheus.Registerer, log *slog.Logger) (*grpcServer, error) {
	api, err := grpcapi.New(rt.core, grpcapi.Options{Tokens: rt.tokens, Logger: log})
	if err != nil {
		return nil, err
	}
	outcomes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "sluice", Name: "envoy_descriptors_total",
		Help: "Descriptors of Envoy rate-limit requests by outcome; domain is \"other\" for a domain no rule names.",
	}, []string{"domain", "outcome"})
	if err := registerAll(reg, outcomes); err != nil {
		return nil, err
	}
	envoy, err := rls.New(rt.core, rls.Options{
		LegacyHeaders: rt.cfg.Envoy.LegacyHeaders,
		Logger:        log,
		Outcome: func(domain string, known bool, o rls.Outcome) {
			if !known {
				domain = "other"
			}
			outcomes.WithLabelValues(domain, string(o)).Inc()
		},
	})
	if err != nil {
		return nil, err
	}
	g := &grpcServer{closing: make(chan struct{})}
	srv := grpc.NewServer(
		grpc.MaxRecvMsgSize(grpcMaxRecvBytes),
		grpc.MaxSendMsgSize(grpcMaxSendBytes),
		grpc.MaxConcurrentStreams(grpcMaxStreams),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: grpcKeepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: grpcKeepaliveTime, Timeout: grpcKeepaliveTimeout, MaxConnectionIdle: grpcConnectionIdle}),
		grpc.ChainUnaryInterceptor(api.UnaryAuth),
		grpc.ChainStreamInterceptor(api.StreamAuth, g.endAtShutdown),
	)
	api.Register(srv)
	rlsv3.RegisterRateLimitServiceServer(srv, envoy)
	h := health.NewServer()
	healthpb.RegisterHealthServer(srv, h)
	reflection.Register(srv)
	g.srv, g.health = srv, h
	g.setServing(false)
	return g, nil
}

// endAtShutdown gives each stream a context that also ends when the
// shutdown begins, so that a stream that would run for as long as the
// client stays (a health Watch, which returns when its context ends) lets
// the server stop.
func (g *grpcServer) endAtShutdown(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, cancel := context.WithCancel(ss.Context())
	defer cancel()
	go func() {
		select {
		case <-g.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	return handler(srv, shutdownStream{ss, ctx})
}

// shutdownStream is a stream whose context is endAtShutdown's.
type shutdownStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s shutdownStream) Context() context.Context { return s.ctx }

// beginShutdown reports NOT_SERVING and ends the open streams; calls in
// flight go on.
func (g *grpcServer) beginShutdown() {
	g.setServing(false)
	g.closeOnce.Do(func() { close(g.closing) })
}

// setServing reports every service SERVING or NOT_SERVING.
func (g *grpcServer) setServing(on bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if on {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range grpcServices {
		g.health.SetServingStatus(name, st)
	}
}
