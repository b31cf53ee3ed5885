package config

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
)

// Config is a validated configuration of the sluice serve service: what it
// listens on, who may call it, the store it decides in, the guard around
// that store, and the named policies. Parse and Load return one; Default
// is the configuration without a file. Every field holds the value in
// force, defaults filled in, except where a field's comment says that zero
// means not set.
type Config struct {
	// Version identifies the configuration: the first 12 hexadecimal digits
	// of the SHA-256 of the file's bytes (comments and white space
	// included), as `sha256sum FILE | cut -c1-12` prints them. The service
	// shows it in /v1/status and in its metrics, so a reload can be seen.
	Version string
	// Listen holds the addresses to listen on.
	Listen Listen
	// Auth says which bearer tokens the HTTP API accepts.
	Auth Auth
	// Store is the store the decisions are made in.
	Store Store
	// Guard is the deadline, failure mode and circuit breaker around the
	// store.
	Guard Guard
	// Policies are the named quotas, in the order of the file.
	Policies []Policy
	// Envoy configures Envoy's rate-limit service on the gRPC listener.
	Envoy Envoy
}

// Envoy configures the answers to Envoy's rate-limit service
// (envoy.service.ratelimit.v3), which the gRPC listener always serves.
type Envoy struct {
	// Config is the path of a file or directory of envoyproxy/ratelimit
	// configuration files (every file of a directory and of its
	// subdirectories, but those whose names start with a dot), read as
	// that service reads them: a domain, its descriptors and their
	// limits, each descriptor rule becoming a policy of its own. It is
	// relative to the working directory of the service if not absolute, and
	// reloaded with the service's own config. Empty: requests are matched
	// against no rule, and answered OK.
	Config string
	// LegacyHeaders adds the RateLimit-Limit, RateLimit-Remaining and
	// RateLimit-Reset response headers (envoyproxy/ratelimit's names) to
	// the RateLimit and RateLimit-Policy fields every answer carries.
	LegacyHeaders bool
}

// Listen holds the addresses the service listens on, each host:port as
// net.Listen reads it (an empty host is every interface; port 0 a free port,
// for tests).
type Listen struct {
	// HTTP is the address of the HTTP API. Default ":8080".
	HTTP string
	// GRPC is the address of the gRPC API: the sluice.v1 service, Envoy's
	// rate-limit service, health and reflection. Default ":8081".
	GRPC string
	// Admin is the address of the metrics, health and admin endpoints.
	// Default "127.0.0.1:9090": loopback, since these endpoints are not
	// authenticated; set ":9090" where a scraper or a health checker
	// reaches the service over the network (a container, a pod).
	Admin string
}

// Auth says where the bearer tokens of the HTTP API come from. At most one
// field is set; none means no authentication. Tokens are never written in
// the config itself, which is checked in, printed and hashed: read them with
// ParseTokens from the file or the environment variable named here.
type Auth struct {
	// BearerTokensFile is the path of a file of tokens (ParseTokens),
	// relative to the working directory of the service if not absolute.
	BearerTokensFile string
	// BearerTokensEnv is the name of an environment variable holding the
	// tokens (ParseTokens).
	BearerTokensEnv string
}

// Enabled reports whether the HTTP API requires a bearer token.
func (a Auth) Enabled() bool { return a.BearerTokensFile != "" || a.BearerTokensEnv != "" }

// StoreType names a store.
type StoreType string

// The stores.
const (
	// StoreMemory is the in-process store (package memstore): buckets are
	// neither shared with other instances nor kept over a restart.
	StoreMemory StoreType = "memory"
	// StoreRedis is the Redis store (package redisstore).
	StoreRedis StoreType = "redis"
	// StorePostgres is the PostgreSQL store (package pgstore).
	StorePostgres StoreType = "postgres"
)

// Shared reports whether the store is shared by every instance of the
// service (Redis, PostgreSQL), rather than held by each (memory).
func (t StoreType) Shared() bool { return t == StoreRedis || t == StorePostgres }

// Store configures the store. Only the section of Type is set; the others
// are zero.
type Store struct {
	// Type is the store. Default StoreMemory.
	Type StoreType
	// OnLimitChange converts a bucket's level when its policy's limit
	// changes (a reload). Default sluice.KeepTokens.
	OnLimitChange sluice.Conversion
	// RequestIDTTL is how long the first allowed decision of a request ID
	// is remembered. Default 5 minutes; 1 second to 24 hours.
	RequestIDTTL time.Duration
	// Memory configures the memory store.
	Memory MemoryStore
	// Redis configures the Redis store.
	Redis RedisStore
	// Postgres configures the PostgreSQL store.
	Postgres PostgresStore
}

// Overflow names what the memory store does with a new key when it holds
// MaxKeys buckets and none can be dropped without loss.
type Overflow string

// The overflow rules, as memstore.RefuseNew and memstore.EvictLRU.
const (
	// OverflowRefuse fails a request for a new key (sluice.ErrTooManyKeys).
	OverflowRefuse Overflow = "refuse"
	// OverflowEvictLRU drops the least recently used of a sample of
	// buckets; each eviction can grant its key one extra burst.
	OverflowEvictLRU Overflow = "evict-lru"
)

// MemoryStore configures the memory store (memstore.Options).
type MemoryStore struct {
	// MaxKeys bounds the buckets held at once, over all policies.
	// Default 1,048,576 (about 100 MiB); 1 to 2^30.
	MaxKeys int
	// Overflow is what happens to a new key at MaxKeys. Default
	// OverflowRefuse.
	Overflow Overflow
	// MaxRequestIDs bounds the remembered request IDs. Default 262,144;
	// 256 (one per shard) to 2^30.
	MaxRequestIDs int
	// Snapshot is a file the service writes every bucket to on shutdown
	// and reads them from on start, so that a restart does not hand every
	// key a fresh burst. Empty: none. Its directory must exist.
	Snapshot string
	// SnapshotMaxAge refuses, on start, a snapshot written longer ago than
	// this. Zero (the default) accepts any age: each bucket refills by the
	// time that passed, exactly.
	SnapshotMaxAge time.Duration
}

// RedisStore configures the Redis store. Exactly one of URL, Cluster and
// Sentinel is set.
type RedisStore struct {
	// URL is one Redis server: redis://[user[:password]@]host[:port][/db],
	// rediss:// for TLS, or unix://[user[:password]@]/path/to/socket. Its
	// query parameters are go-redis's and are not checked here.
	URL URL
	// Cluster are seed addresses (host:port) of a Redis Cluster.
	Cluster []string
	// Sentinel names a primary found through Redis Sentinel.
	Sentinel Sentinel
	// Username is the ACL user, for Cluster and Sentinel (a URL carries
	// its own).
	Username string
	// PasswordEnv names an environment variable holding the password:
	// for Cluster and Sentinel, or for a URL without a password.
	PasswordEnv string
	// TLS connects with TLS, for Cluster and Sentinel (a URL says rediss).
	TLS bool
	// Prefix starts every key the store writes. Default "sluice:"; 1 to
	// 64 printable ASCII bytes without '{' or '}'.
	Prefix string
	// Batch is the most concurrent decisions sent in one pipeline
	// (redisstore.Options.Batch): 1 to 1000, default 64; 1 sends every
	// decision on its own. Pipelines is the most pipelines in flight
	// (redisstore.Options.Pipelines): 1 to 64, default 2.
	Batch, Pipelines int
}

// RedisMode names how the Redis store reaches Redis: "url", "cluster",
// "sentinel", or "" if none is set.
func (r RedisStore) RedisMode() string {
	switch {
	case !r.URL.IsZero():
		return "url"
	case len(r.Cluster) > 0:
		return "cluster"
	case r.Sentinel.Master != "" || len(r.Sentinel.Addrs) > 0:
		return "sentinel"
	}
	return ""
}

// Sentinel names a Redis primary and the Sentinels that know it.
type Sentinel struct {
	// Master is the name the Sentinels monitor the primary under.
	Master string
	// Addrs are the Sentinels' addresses (host:port).
	Addrs []string
}

// PostgresStore configures the PostgreSQL store (pgstore.Options).
type PostgresStore struct {
	// URL is postgres://[user[:password]@]host[:port]/database[?param=value].
	// Leave the password out and let the driver read PGPASSWORD or a
	// password file.
	URL URL
	// Schema holds the store's tables. Default "public"; an identifier of
	// 1 to 63 bytes.
	Schema string
	// Table is the bucket table. Default "sluice_buckets"; an identifier
	// of 1 to 43 bytes.
	Table string
	// StatementTimeout bounds each decision's statement on the server
	// (pgstore.Options.StatementTimeout), and LockTimeout its wait for a
	// bucket's row lock; 1ms to 1m, default 200ms and 100ms. A decision
	// cut off by either is an error, which the guard's failure mode
	// decides.
	StatementTimeout, LockTimeout time.Duration
	// PerTransactionTimeouts sets both timeouts in each decision's
	// transaction, a statement before the decision's, instead of in the
	// pool's sessions (pgstore.SessionTimeouts): for a connection pooler
	// that does not pass startup parameters on to PostgreSQL, such as
	// PgBouncer. Default false.
	PerTransactionTimeouts bool
	// Batch is the most concurrent takes one transaction decides
	// (pgstore.Options.Batch): 1 to 1000, default 64; 1 sends every take
	// in a transaction of its own. Transactions is the most takes in
	// flight before later ones queue to share a transaction
	// (pgstore.Options.Transactions): 1 to 256, default 2.
	Batch, Transactions int
}

// FailureMode names what decides when the store cannot, as
// guard.ParseFailureMode reads it.
type FailureMode string

// The failure modes of package guard.
const (
	// FailLocal decides against in-process buckets holding 1/LocalDivisor
	// of each limit.
	FailLocal FailureMode = "local"
	// FailClosed denies.
	FailClosed FailureMode = "closed"
	// FailOpen allows; no limit holds during an outage.
	FailOpen FailureMode = "open"
)

// Guard configures the guard around the store (guard.Options). The service
// always puts the store behind it, the memory store too.
type Guard struct {
	// Timeout is the deadline of every store call. Default 50ms; 1ms to
	// 10s.
	Timeout time.Duration
	// FailureMode decides when the store fails or does not answer in
	// time. Default FailLocal.
	FailureMode FailureMode
	// LocalDivisor is, for FailLocal, the number of instances sharing the
	// store: each instance's local buckets hold 1/LocalDivisor of each
	// limit. 1 to 10,000; zero means not set: 1, which lets every instance
	// allow the whole limit during an outage (Warnings says so for a
	// shared store).
	LocalDivisor int64
	// LocalMaxKeys bounds the local buckets of FailLocal. Default 65,536;
	// 1 to 2^30.
	LocalMaxKeys int
	// Breaker configures the circuit breaker.
	Breaker Breaker
}

// Breaker configures the guard's circuit breaker. Unlike guard.Options,
// where zero means the default and a negative value disables a trigger,
// zero here disables a trigger, and the defaults are filled in.
type Breaker struct {
	// ConsecutiveFailures opens the breaker after that many store failures
	// in a row. Default 5; 0 (this trigger off) to 1,000,000.
	ConsecutiveFailures int
	// FailurePercent opens the breaker when at least that percentage of
	// the calls of the last Window failed. Default 50; 0 (this trigger off)
	// to 100.
	FailurePercent int
	// Window is the sliding window of FailurePercent. Default 1s; 100ms
	// to 10m.
	Window time.Duration
	// MinCalls is the fewest calls in Window that FailurePercent judges.
	// Default 10; 1 to 1,000,000.
	MinCalls int
	// ProbeInterval is how long the breaker stays open before it lets one
	// call through as a probe. Default 500ms; 10ms to 10m.
	ProbeInterval time.Duration
}

// Policy is a named quota.
type Policy struct {
	// Name is the policy name (sluice.ValidatePolicy): the bucket
	// namespace in the store, the name requests give.
	Name string
	// Limits are the policy's limits: one, or several (at most 8) decided
	// together, a request being allowed only if every limit allows it,
	// and then charged to all of them.
	Limits []sluice.Limit
	// Shadow decides and records every request, but always allows it:
	// a denial is counted as one that would have been made. For trying a
	// limit on live traffic.
	Shadow bool
}

// Policy returns the policy named name.
func (c *Config) Policy(name string) (Policy, bool) {
	for _, p := range c.Policies {
		if p.Name == name {
			return p, true
		}
	}
	return Policy{}, false
}

// Defaults of the fields a file leaves out.
const (
	DefaultHTTP          = ":8080"
	DefaultGRPC          = ":8081"
	DefaultAdmin         = "127.0.0.1:9090"
	DefaultRequestIDTTL  = 5 * time.Minute
	DefaultMaxKeys       = 1 << 20
	DefaultMaxRequestIDs = 1 << 18
	DefaultRedisPrefix   = "sluice:"
	// The Redis store's batching, redisstore's defaults.
	DefaultRedisBatch     = 64
	DefaultRedisPipelines = 2
	DefaultSchema         = "public"
	DefaultTable          = "sluice_buckets"
	// The PostgreSQL store's timeouts, pgstore's defaults.
	DefaultStatementTimeout = 200 * time.Millisecond
	DefaultLockTimeout      = 100 * time.Millisecond
	// The PostgreSQL store's shared transactions, pgstore's defaults.
	DefaultPGBatch        = 64
	DefaultPGTransactions = 2
	// DefaultTimeout fits in Envoy's rate-limit filter's default timeout
	// of 20ms with room for the network and the service: a store slower
	// than that is decided by the failure mode, which Envoy waiting longer
	// than its own timeout would not see.
	DefaultTimeout       = 15 * time.Millisecond
	DefaultLocalMaxKeys  = 1 << 16
	DefaultConsecutive   = 5
	DefaultPercent       = 50
	DefaultWindow        = time.Second
	DefaultMinCalls      = 10
	DefaultProbeInterval = 500 * time.Millisecond
)

// DefaultYAML is the configuration the service runs without a config file:
// the in-memory store and one policy, "default", of "100 10/s" (a burst of
// 100 requests per key, refilled at 10 a second), every other value its
// default. Default returns it parsed; its Version is the hash of these
// bytes, so a file holding them has the same version.
//
//go:embed default.yaml
var DefaultYAML string

var defaultConfig = sync.OnceValue(func() Config {
	c, err := Parse([]byte(DefaultYAML))
	if err != nil {
		// default.yaml is part of the package and tested; it cannot
		// fail unless the package itself is broken.
		panic("config: default.yaml does not parse: " + err.Error())
	}
	return c
})

// Default returns the configuration of DefaultYAML.
func Default() Config {
	c := defaultConfig()
	c.Policies = clonePolicies(c.Policies)
	return c
}

func clonePolicies(ps []Policy) []Policy {
	out := make([]Policy, len(ps))
	for i, p := range ps {
		p.Limits = append([]sluice.Limit(nil), p.Limits...)
		out[i] = p
	}
	return out
}

// base is the configuration every file starts from: the defaults, the
// memory store, no policies.
func base() Config {
	return Config{
		Listen: Listen{HTTP: DefaultHTTP, GRPC: DefaultGRPC, Admin: DefaultAdmin},
		Store: Store{
			Type:          StoreMemory,
			OnLimitChange: sluice.KeepTokens,
			RequestIDTTL:  DefaultRequestIDTTL,
			Memory:        defaultMemory(),
		},
		Guard: Guard{
			Timeout:      DefaultTimeout,
			FailureMode:  FailLocal,
			LocalMaxKeys: DefaultLocalMaxKeys,
			Breaker: Breaker{
				ConsecutiveFailures: DefaultConsecutive,
				FailurePercent:      DefaultPercent,
				Window:              DefaultWindow,
				MinCalls:            DefaultMinCalls,
				ProbeInterval:       DefaultProbeInterval,
			},
		},
	}
}

func defaultMemory() MemoryStore {
	return MemoryStore{MaxKeys: DefaultMaxKeys, Overflow: OverflowRefuse, MaxRequestIDs: DefaultMaxRequestIDs}
}

// version returns the Version of data.
func version(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:6])
}
