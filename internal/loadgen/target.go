package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/sluicehq/sluice"
)

// Item is one take of a request: the key and the cost.
type Item struct {
	Key  string
	Cost int64
}

// Outcome is what became of one take.
type Outcome uint8

// The outcomes of a take.
const (
	// Allowed: the take was allowed (a shadow policy's would-be denial
	// too, which the service answers as allowed).
	Allowed Outcome = iota + 1
	// Denied: the take was denied, by the store or, degraded, by the
	// service's failure mode while its store is down.
	Denied
	// Failed: no decision came back: a transport error, a timeout, an
	// error status, an answer that could not be read.
	Failed
)

// Result is the answer to one take.
type Result struct {
	Outcome Outcome
	// Degraded reports a decision the service's failure mode made because
	// its store could not be asked.
	Degraded bool
	// ShadowDenied reports a denial of a shadow policy, answered allowed.
	ShadowDenied bool
	// Kind groups the errors of Failed takes in the summary, in a few
	// words: "timeout", "connection refused", "http 503",
	// "grpc UNAVAILABLE", "store unavailable".
	Kind string
	// Detail is the error's message; the summary keeps the first of each
	// kind.
	Detail string
}

// The error kinds whose requests' latencies are recorded.
const (
	kindTimeout = "timeout"
	kindOverdue = "overdue"
)

// fail returns the Result of a failed take.
func fail(kind, detail string) Result {
	return Result{Outcome: Failed, Kind: kind, Detail: detail}
}

// A Target is what the load goes to: a running service over one of its
// APIs, or a store in this process.
type Target interface {
	// Describe says what one request is, for the summary: "POST
	// http://127.0.0.1:8080/v1/take, policy \"api\"". Passwords in URLs
	// are redacted.
	Describe() string
	// Check asks the target once, taking nothing, whether it answers and
	// knows the policy, and whether a take of cost would be a valid
	// request (not above the policy's capacity). Its error says what is
	// wrong and what to do.
	Check(ctx context.Context, key string, cost int64) error
	// Sender returns the sender of request slot i. A slot's sender is
	// used by one goroutine at a time.
	Sender(i int) Sender
	// Close closes the target's connections.
	Close() error
}

// A Sender sends requests for one request slot.
type Sender interface {
	// Send sends one request of the takes items and writes what became of
	// items[i] into out[i], which it finds zero. It returns when the
	// answer is in or ctx (which carries the request's timeout) ends, and
	// the time the answer was read in full, before it was decoded (the
	// zero Time: when Send returned), which ends the request's latency.
	Send(ctx context.Context, items []Item, out []Result) time.Time
}

// The kinds of target a TargetConfig.URL names.
const (
	KindHTTP     = "http"     // http:// or https://: POST /v1/take, /v1/take:batch
	KindGRPC     = "grpc"     // grpc://: sluice.v1 Take, TakeBatch
	KindEnvoy    = "envoy"    // envoy://: Envoy's ShouldRateLimit
	KindMemory   = "memory"   // memory: memstore in this process
	KindRedis    = "redis"    // redis://, rediss://, unix://: redisstore
	KindPostgres = "postgres" // postgres://, postgresql://: pgstore
)

// TargetConfig says which target to open and how.
type TargetConfig struct {
	// URL names the target: http://HOST:PORT (or https://),
	// grpc://HOST:PORT, envoy://HOST:PORT, memory, redis://...,
	// postgres://....
	URL string
	// Policy is the policy every take names (for a store, the bucket
	// namespace).
	Policy string
	// Limit is the limit of a store target's policy; a service's own
	// config decides for the others.
	Limit sluice.Limit
	// Domain and Descriptor are the Envoy target's domain and the key of
	// its one descriptor entry; the take's key is the entry's value.
	Domain, Descriptor string
	// Token is the bearer token of a service that requires one.
	Token string
	// AllowRemote allows a host other than a loopback address. Without
	// it, every connection is also checked when it is made.
	AllowRemote bool
	// Batch is the takes of one request: above 1, the HTTP and gRPC
	// targets send batches; the others take none.
	Batch int
	// Slots is the number of request slots (the most requests in flight).
	Slots int
	// Conns is the number of gRPC connections the slots share.
	Conns int
	// Timeout bounds a connection's dial.
	Timeout time.Duration
	// MaxKeys is the number of keys, for the memory store's bound.
	MaxKeys int
	// PGSchema and PGTable name pgstore's tables ("" for its defaults).
	PGSchema, PGTable string
	// PGPerTransactionTimeouts sets pgstore's timeouts in each decision's
	// transaction instead of in the pool's sessions, as the service's
	// store.postgres.per_transaction_timeouts does (for PgBouncer).
	PGPerTransactionTimeouts bool
	// StoreBatch is the Redis or PostgreSQL store's Options.Batch: the
	// most concurrent decisions it sends together (0: the store's
	// default; 1: each alone).
	StoreBatch int
}

// Kind returns the kind of target url names, or "" for none.
func Kind(url string) string {
	scheme, _, _ := strings.Cut(url, "://")
	switch {
	case url == "memory":
		return KindMemory
	case !strings.Contains(url, "://"):
		return ""
	case scheme == "http" || scheme == "https":
		return KindHTTP
	case scheme == "grpc":
		return KindGRPC
	case scheme == "envoy":
		return KindEnvoy
	case scheme == "redis" || scheme == "rediss" || scheme == "unix":
		return KindRedis
	case scheme == "postgres" || scheme == "postgresql":
		return KindPostgres
	}
	return ""
}

// Open opens the target c names; it connects to nothing yet (Check does).
// Errors wrap sluice.ErrInvalidOption for a bad configuration, and
// ErrRemote for a host that is not a loopback address without
// AllowRemote.
func Open(ctx context.Context, c TargetConfig) (Target, error) {
	if err := sluice.ValidatePolicy(c.Policy); err != nil {
		return nil, err
	}
	if c.Slots < 1 {
		return nil, fmt.Errorf("%w: %d request slots: want at least 1", sluice.ErrInvalidOption, c.Slots)
	}
	if c.Batch < 1 || c.Batch > MaxBatch {
		return nil, fmt.Errorf("%w: batch of %d takes: want 1 to %d", sluice.ErrInvalidOption, c.Batch, MaxBatch)
	}
	if c.Timeout <= 0 {
		c.Timeout = 5 * time.Second
	}
	kind := Kind(c.URL)
	if c.Batch > 1 && kind != KindHTTP && kind != KindGRPC {
		return nil, fmt.Errorf("%w: batches of takes go to http:// and grpc:// targets only, not %s", sluice.ErrInvalidOption, redact(c.URL))
	}
	switch kind {
	case KindHTTP:
		return openHTTP(ctx, c)
	case KindGRPC, KindEnvoy:
		return openGRPC(ctx, c, kind == KindEnvoy)
	case KindMemory:
		return openMemory(c)
	case KindRedis:
		return openRedis(ctx, c)
	case KindPostgres:
		return openPostgres(ctx, c)
	}
	return nil, fmt.Errorf("%w: target %q: want http://HOST:PORT, grpc://HOST:PORT, envoy://HOST:PORT, memory, redis://HOST:PORT/DB or postgres://USER@HOST/DB", sluice.ErrInvalidOption, redact(c.URL))
}

// ErrRemote means a target's host is not a loopback address and
// TargetConfig.AllowRemote was not set.
var ErrRemote = errors.New("loadgen: not a loopback address")

// remoteErr is an error that is ErrRemote, with a message of its own.
type remoteErr struct{ msg string }

func (e remoteErr) Error() string        { return e.msg }
func (e remoteErr) Is(target error) bool { return target == ErrRemote }

// remoteError is the error for host: load sent to the wrong host by
// mistake is an outage, so the refusal says how to mean it.
func remoteError(target, host, why string) error {
	return remoteErr{fmt.Sprintf("target %s: %s %s; a load generator pointed at the wrong host causes an outage, so only loopback addresses (127.0.0.0/8, ::1, localhost) are allowed unless -allow-remote is given", target, host, why)}
}

// checkHost makes sure host (a name or an IP address, without a port) is
// a loopback address, unless allow. A name is resolved, and each of its
// addresses must be loopback; "" is the local host.
func checkHost(ctx context.Context, target, host string, allow bool) error {
	if allow || host == "" {
		return nil
	}
	h := strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if i := strings.IndexByte(h, '%'); i >= 0 {
		h = h[:i] // an IPv6 zone
	}
	if ip := net.ParseIP(h); ip != nil {
		if !ip.IsLoopback() {
			return remoteError(target, host, "is not a loopback address")
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupIPAddr(ctx, h)
	if err != nil {
		return fmt.Errorf("target %s: resolving %s: %w", target, host, err)
	}
	for _, a := range addrs {
		if !a.IP.IsLoopback() {
			return remoteError(target, host, "resolves to "+a.IP.String()+", not a loopback address")
		}
	}
	return nil
}

// checkedDial dials address and, unless allow, refuses a connection whose
// remote address is not loopback: the check at Open saw the names as they
// resolved then, this one sees where each connection goes.
func checkedDial(target string, allow bool, timeout time.Duration) func(ctx context.Context, network, address string) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		conn, err := d.DialContext(ctx, network, address)
		if err != nil || allow {
			return conn, err
		}
		if a, ok := conn.RemoteAddr().(*net.TCPAddr); ok && !a.IP.IsLoopback() {
			conn.Close()
			return nil, remoteError(target, address, "connected to "+a.IP.String()+", not a loopback address")
		}
		return conn, nil
	}
}

// redact returns a URL with its password replaced by "xxxxx", for
// messages.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return s
	}
	return u.Redacted()
}

// errorKind names the kind of a transport or context error in a few
// words, for the summary's errors by kind.
func errorKind(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return kindTimeout
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, ErrRemote):
		return "remote address refused"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "connection reset"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed"
	case errors.As(err, &ne) && ne.Timeout():
		return kindTimeout
	}
	return "transport error"
}

// truncate shortens a message for the summary.
func truncate(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
