package grpcapi

import (
	"context"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// publicServices are the services a call needs no token for: the health
// service, which load balancers and orchestrators probe without
// credentials, and reflection, which describes the API (as the proto file
// does) and decides nothing.
var publicServices = map[string]bool{
	"grpc.health.v1.Health":                    true,
	"grpc.reflection.v1.ServerReflection":      true,
	"grpc.reflection.v1alpha.ServerReflection": true,
}

// public reports whether fullMethod, "/package.Service/Method", is a method
// of a public service. The decision is by the full name the server routes
// by, so that no other method can pass for one.
func public(fullMethod string) bool {
	rest, ok := strings.CutPrefix(fullMethod, "/")
	if !ok {
		return false
	}
	svc, _, ok := strings.Cut(rest, "/")
	return ok && publicServices[svc]
}

// errUnauthenticated is the answer to a call without a right token. It
// says neither which was wrong nor what was sent.
var errUnauthenticated = status.Error(codes.Unauthenticated, "missing or wrong bearer token: send the metadata \"authorization: Bearer <token>\"")

// UnaryAuth is the unary server interceptor of the bearer tokens
// (grpc.ChainUnaryInterceptor(s.UnaryAuth)): when tokens are configured,
// every call must carry the metadata "authorization: Bearer <token>" with
// one of them, except the calls of the health and reflection services. It
// applies to every service of the server it is installed on.
func (s *Server) UnaryAuth(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !s.allowed(ctx, info.FullMethod) {
		return nil, errUnauthenticated
	}
	return handler(ctx, req)
}

// StreamAuth is the stream server interceptor of the bearer tokens, as
// UnaryAuth is for unary calls: the RateLimiter service has no streaming
// method, but the server may hold others, and a stream is checked once,
// when it starts.
func (s *Server) StreamAuth(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if !s.allowed(ss.Context(), info.FullMethod) {
		return errUnauthenticated
	}
	return handler(srv, ss)
}

// allowed reports whether a call of fullMethod may proceed.
func (s *Server) allowed(ctx context.Context, fullMethod string) bool {
	if !s.tokens.Enabled() || public(fullMethod) {
		return true
	}
	md, _ := metadata.FromIncomingContext(ctx)
	values := md.Get("authorization")
	return len(values) > 0 && s.tokens.Authorized(values[0])
}
