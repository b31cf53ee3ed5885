package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/guard"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/envoyconf"
	"github.com/sluicehq/sluice/internal/service"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/pgstore"
	"github.com/sluicehq/sluice/promstore"
	"github.com/sluicehq/sluice/promstore/pgprom"
	"github.com/sluicehq/sluice/promstore/redisprom"
	"github.com/sluicehq/sluice/redisstore"
)

// runtime is what a config runs: the store (raw, and wrapped in guard and
// metrics), the core with its policies, the bearer tokens.
type runtime struct {
	path   string
	cfg    config.Config
	raw    sluice.Store
	store  sluice.Store // promstore over guard over raw
	core   *service.Core
	tokens []string
	ping   func(context.Context) error
	closer []func() error

	mu sync.Mutex // serializes reloads
}

// build opens the store of cfg, wraps it in guard and metrics registered on
// reg, and builds the core of cfg's policies.
func build(ctx context.Context, cfg config.Config, reg prometheus.Registerer, log *slog.Logger) (*runtime, error) {
	rt := &runtime{cfg: cfg}
	ok := false
	defer func() {
		if !ok {
			rt.close()
		}
	}()
	raw, ping, err := openStore(ctx, cfg, rt, true)
	if err != nil {
		return nil, err
	}
	rt.raw, rt.ping = raw, ping
	if err := registerStoreStats(reg, raw); err != nil {
		return nil, err
	}
	// The guard's own metrics: store latency and errors by kind, degraded
	// decisions by reason, the breaker's state and changes.
	hooks, err := promstore.GuardHooks(reg, promstore.Options{})
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	g, err := guard.New(raw, guardOptions(cfg.Guard, log, hooks))
	if err != nil {
		return nil, fmt.Errorf("guard: %w", err)
	}
	ps, err := promstore.New(g, reg, promstore.Options{})
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	rt.store = ps
	rules, err := loadEnvoy(&rt.cfg)
	if err != nil {
		return nil, err
	}
	table, err := policyTable(rt.store, rt.cfg, rules)
	if err != nil {
		return nil, err
	}
	shadow := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "sluice", Name: "shadow_denials_total",
		Help: "Denials that a shadow policy allowed: what the policy would have denied.",
	}, []string{"policy"})
	unknown := prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "sluice", Name: "unknown_policy_requests_total",
		Help: "Requests naming a policy the config does not define.",
	})
	if err := registerAll(reg, shadow, unknown); err != nil {
		return nil, err
	}
	reg.MustRegister(versionCollector{rt})
	rt.core, err = service.New(rt.store, table, service.Hooks{
		ShadowDenied:  func(p string) { shadow.WithLabelValues(p).Inc() },
		UnknownPolicy: unknown.Inc,
	})
	if err != nil {
		return nil, err
	}
	if rt.tokens, err = tokens(cfg.Auth); err != nil {
		return nil, err
	}
	ok = true
	return rt, nil
}

// registerStoreStats exports the store's own counters and gauges, read at
// scrape time: the in-memory store's buckets, evictions and refusals, the
// Redis store's script loads and conversions, the PostgreSQL store's
// sweeps, lock waits and inserts of new buckets (docs/failure.md).
func registerStoreStats(reg prometheus.Registerer, st sluice.Store) error {
	var err error
	switch s := st.(type) {
	case *memstore.Store:
		err = promstore.RegisterMemstore(reg, promstore.Options{}, s.Stats)
	case *redisstore.Store:
		err = redisprom.Register(reg, promstore.Options{}, s.Stats)
	case *pgstore.Store:
		err = pgprom.Register(reg, promstore.Options{}, s.Stats)
	}
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	return nil
}

func registerAll(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
	}
	return nil
}

// configInfo is sluice_config_info: 1, labelled with the version of the
// config in use, read from the runtime at every scrape.
var configInfo = prometheus.NewDesc("sluice_config_info",
	"The config in use: its version label is the hash of the file.", []string{"version"}, nil)

// versionCollector exports configInfo for the config in use, which a reload
// replaces.
type versionCollector struct{ rt *runtime }

func (v versionCollector) Describe(ch chan<- *prometheus.Desc) { ch <- configInfo }

func (v versionCollector) Collect(ch chan<- prometheus.Metric) {
	v.rt.mu.Lock()
	version := v.rt.cfg.Version
	v.rt.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(configInfo, prometheus.GaugeValue, 1, version)
}

// policyTable turns cfg's policies, and the policies of the Envoy rules
// (nil for none), into the core's table, checked against store. A rule
// that is unlimited or denies everything has no policy: it needs no
// bucket.
func policyTable(store sluice.Store, cfg config.Config, rules *envoyconf.Config) (*service.Table, error) {
	policies := make([]service.Policy, 0, len(cfg.Policies))
	for _, p := range cfg.Policies {
		policies = append(policies, service.Policy{Name: p.Name, Limits: p.Limits, Shadow: p.Shadow})
	}
	if rules == nil {
		return service.NewTable(store, cfg.Version, policies)
	}
	for _, r := range rules.Rules() {
		if r.Unlimited || r.Deny {
			continue
		}
		policies = append(policies, service.Policy{Name: r.Policy, Limit: r.Limit, Shadow: r.Shadow})
	}
	t, err := service.NewTable(store, cfg.Version, policies)
	if err != nil {
		return nil, fmt.Errorf("envoy.config %s: %w", cfg.Envoy.Config, err)
	}
	return t.WithEnvoy(rules), nil
}

// loadEnvoy reads the Envoy rules cfg names, nil if it names none, and
// makes cfg's version that of both: the config file's, "+", the rules'.
func loadEnvoy(cfg *config.Config) (*envoyconf.Config, error) {
	if cfg.Envoy.Config == "" {
		return nil, nil
	}
	rules, err := envoyconf.Load(cfg.Envoy.Config)
	if err != nil {
		return nil, fmt.Errorf("envoy.config: %w", err)
	}
	if err := rules.CheckLimits(exactness(cfg.Store.Type)); err != nil {
		return nil, fmt.Errorf("envoy.config: %w", err)
	}
	cfg.Version += "+" + rules.Version()
	return rules, nil
}

// What started a reload.
const (
	reloadOnSignal = "SIGHUP"
	reloadOnChange = "file change"
)

// reload reads the config again and, if it is valid, replaces the policies.
// A bad config is refused and logged; the old one keeps serving. Settings
// other than the policies take effect at the next start. trigger says what
// asked for the reload: a file change that left the file's content as it
// was (another file of the directory changed) is not logged.
func (rt *runtime) reload(path string, log *slog.Logger, trigger string) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if path == "" {
		log.Info("reload: no config file; nothing to reload")
		return
	}
	log = log.With("trigger", trigger)
	cfg, err := config.Load(path)
	var rules *envoyconf.Config
	if err == nil {
		rules, err = loadEnvoy(&cfg)
	}
	if err == nil {
		var table *service.Table
		if table, err = policyTable(rt.store, cfg, rules); err == nil {
			if cfg.Version == rt.cfg.Version {
				if trigger != reloadOnChange {
					log.Info("reload: config unchanged", "version", cfg.Version)
				}
				return
			}
			if restart := restartNeeded(rt.cfg, cfg); len(restart) > 0 {
				log.Warn("reload: these settings change only at the next start", "settings", strings.Join(restart, ", "))
			}
			rt.core.SetTable(table)
			for _, w := range rules.Warnings() {
				log.Warn("reload: envoy rules", "warning", w)
			}
			log.Info("reload: new config in use", "version", cfg.Version, "previous", rt.cfg.Version, "policies", len(table.Policies()))
			rt.cfg.Policies, rt.cfg.Version = cfg.Policies, cfg.Version
			return
		}
	}
	log.Error("reload: config refused; the previous one keeps serving", "version", rt.cfg.Version, "error", err)
}

// restartNeeded names the settings of next that differ from cur other than
// the policies.
func restartNeeded(cur, next config.Config) []string {
	var out []string
	if fmt.Sprint(cur.Listen) != fmt.Sprint(next.Listen) {
		out = append(out, "listen")
	}
	if fmt.Sprint(cur.Auth) != fmt.Sprint(next.Auth) {
		out = append(out, "auth")
	}
	if fmt.Sprint(cur.Store) != fmt.Sprint(next.Store) {
		out = append(out, "store")
	}
	if fmt.Sprint(cur.Guard) != fmt.Sprint(next.Guard) {
		out = append(out, "guard")
	}
	if cur.Envoy.LegacyHeaders != next.Envoy.LegacyHeaders {
		out = append(out, "envoy.legacy_headers")
	}
	if cur.Envoy.Config != next.Envoy.Config {
		// The rules of the new path are in use; its directory is watched
		// from the next start (SIGHUP reloads them meanwhile).
		out = append(out, "the watch of envoy.config's new path")
	}
	return out
}

func (rt *runtime) close() {
	for i := len(rt.closer) - 1; i >= 0; i-- {
		rt.closer[i]() //nolint:errcheck // shutting down
	}
	rt.closer = nil
}

// openStore opens the store cfg names and a check that it answers. serving
// readies it for decisions at once (PostgreSQL's connections opened and
// warmed) and starts its background maintenance, where it has them; a
// one-off command such as migrate passes false.
func openStore(ctx context.Context, cfg config.Config, rt *runtime, serving bool) (sluice.Store, func(context.Context) error, error) {
	s := cfg.Store
	switch s.Type {
	case config.StoreMemory:
		overflow := memstore.RefuseNew
		if s.Memory.Overflow == config.OverflowEvictLRU {
			overflow = memstore.EvictLRU
		}
		st, err := memstore.New(memstore.Options{
			MaxKeys:       s.Memory.MaxKeys,
			Overflow:      overflow,
			MaxRequestIDs: s.Memory.MaxRequestIDs,
			OnLimitChange: s.OnLimitChange,
			RequestIDTTL:  s.RequestIDTTL,
		})
		if err != nil {
			return nil, nil, fmt.Errorf("store.memory: %w", err)
		}
		rt.closer = append(rt.closer, st.Close)
		return st, func(context.Context) error { return nil }, nil

	case config.StoreRedis:
		client, err := redisClient(s.Redis)
		if err != nil {
			return nil, nil, fmt.Errorf("store.redis: %w", err)
		}
		rt.closer = append(rt.closer, client.Close)
		st, err := redisstore.New(client, redisOptions(s))
		if err != nil {
			return nil, nil, fmt.Errorf("store.redis: %w", err)
		}
		return st, func(ctx context.Context) error { return client.Ping(ctx).Err() }, nil

	case config.StorePostgres:
		o := postgresOptions(s)
		pc, err := postgresPoolConfig(s.Postgres, o, serving)
		if err != nil {
			return nil, nil, err
		}
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			return nil, nil, fmt.Errorf("store.postgres: %w", err)
		}
		rt.closer = append(rt.closer, func() error { pool.Close(); return nil })
		if !serving {
			o.SweepInterval = -1
		}
		st, err := pgstore.New(ctx, pool, o)
		if err != nil {
			return nil, nil, fmt.Errorf("store.postgres: %w", err)
		}
		rt.closer = append(rt.closer, st.Close)
		return st, func(ctx context.Context) error {
			if err := pool.Ping(ctx); err != nil {
				return err
			}
			// A database that answers but holds no schema of this version
			// is not ready either: every decision would fail.
			_, err := st.Peek(ctx, readinessProbe)
			return err
		}, nil
	}
	return nil, nil, fmt.Errorf("%w: store.type %q", sluice.ErrInvalidOption, s.Type)
}

// postgresPoolConfig returns the config of the pool of a PostgreSQL store
// of o: for a service (serving), one that warms each new connection, keeps
// all of them open and carries the timeouts in its sessions.
func postgresPoolConfig(pg config.PostgresStore, o pgstore.Options, serving bool) (*pgxpool.Config, error) {
	pc, err := pgxpool.ParseConfig(pg.URL.Value())
	if err != nil {
		return nil, fmt.Errorf("store.postgres.url: %w", errors.New("not a valid PostgreSQL URL")) // the driver's message may show the password
	}
	// A service warms each new connection before it decides: a cold
	// one's first decision can outlast the statement timeout when many
	// open at once, as on a restart under load. Its pool opens all of
	// its connections in the background at start and keeps them, so
	// that a decision seldom waits for a connection to open (longer
	// than the guard's deadline), unless the URL sets pool_min_conns.
	// The pool is the service's own, so its sessions start with the
	// decisions' timeouts, and a decision sends no statement to set
	// them (pgstore.SessionTimeouts), unless the config says a pooler
	// would not pass them on. Migrate needs none of this.
	if serving {
		if pc.AfterConnect, err = pgstore.AfterConnect(o); err != nil {
			return nil, fmt.Errorf("store.postgres: %w", err)
		}
		if !pg.PerTransactionTimeouts {
			if err := pgstore.SessionTimeouts(pc, o); err != nil {
				return nil, fmt.Errorf("store.postgres: %w", err)
			}
		}
		if u, err := url.Parse(pg.URL.Value()); err == nil && !u.Query().Has("pool_min_conns") {
			pc.MinConns = pc.MaxConns
		}
	}
	// The server's pg_stat_activity names the service, unless the URL
	// names it otherwise.
	if _, ok := pc.ConnConfig.RuntimeParams["application_name"]; !ok {
		pc.ConnConfig.RuntimeParams["application_name"] = "sluice"
	}
	return pc, nil
}

// readinessProbe is the peek /readyz makes in a PostgreSQL store, to see
// that its schema is there: a peek creates nothing, and the policy is one
// the service's own config is unlikely to name.
var readinessProbe = sluice.Request{
	Policy: "sluice.readyz", Key: "probe", Cost: 1,
	Limit: sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(1)},
}

// redisClient returns the go-redis client of r, configured so that every
// call keeps the caller's deadline and nothing is retried behind its back.
// A dial is tried once: with go-redis's default of five tries 100ms apart,
// a call while Redis refuses connections failed only after 400ms or at the
// guard's deadline (most did, under load), so each probe of the breaker
// held that long and counted as a timeout, and recovery could wait for the
// probe after it.
func redisClient(r config.RedisStore) (redis.UniversalClient, error) {
	password := ""
	if r.PasswordEnv != "" {
		password = os.Getenv(r.PasswordEnv)
	}
	var tlsConfig *tls.Config
	if r.TLS {
		tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	switch {
	case !r.URL.IsZero():
		o, err := redis.ParseURL(r.URL.Value())
		if err != nil {
			return nil, errors.New("url is not a valid Redis URL") // the parser's message may show the password
		}
		if r.Username != "" {
			o.Username = r.Username
		}
		if password != "" {
			o.Password = password
		}
		if tlsConfig != nil && o.TLSConfig == nil {
			o.TLSConfig = tlsConfig
		}
		o.ContextTimeoutEnabled, o.MaxRetries, o.DialerRetries = true, -1, 1
		return redis.NewClient(o), nil
	case len(r.Cluster) > 0:
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: r.Cluster, Username: r.Username, Password: password, TLSConfig: tlsConfig,
			ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1,
		}), nil
	default:
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: r.Sentinel.Master, SentinelAddrs: r.Sentinel.Addrs,
			Username: r.Username, Password: password, TLSConfig: tlsConfig,
			ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1,
		}), nil
	}
}

// guardOptions maps the config's guard section onto guard.Options: a
// breaker trigger of 0 in the config turns it off, which guard spells -1.
// The guard calls metrics, and logs each change of the breaker.
func guardOptions(g config.Guard, log *slog.Logger, metrics guard.Hooks) guard.Options {
	mode := guard.FailLocal
	switch g.FailureMode {
	case config.FailClosed:
		mode = guard.FailClosed
	case config.FailOpen:
		mode = guard.FailOpen
	}
	off := func(n int) int {
		if n == 0 {
			return -1
		}
		return n
	}
	return guard.Options{
		FailureMode:         mode,
		LocalDivisor:        g.LocalDivisor,
		LocalMaxKeys:        g.LocalMaxKeys,
		Timeout:             g.Timeout,
		ConsecutiveFailures: off(g.Breaker.ConsecutiveFailures),
		FailurePercent:      off(g.Breaker.FailurePercent),
		Window:              g.Breaker.Window,
		MinCalls:            g.Breaker.MinCalls,
		ProbeInterval:       g.Breaker.ProbeInterval,
		// One line per change of the breaker, not per degraded decision:
		// an outage must not flood the log (the metrics count each one).
		Hooks: guard.Hooks{
			StoreCall: metrics.StoreCall,
			Degraded:  metrics.Degraded,
			BreakerChange: func(from, to guard.BreakerState) {
				metrics.BreakerChange(from, to)
				log.Warn("store circuit breaker", "from", from.String(), "to", to.String(), "failure_mode", mode.String())
			},
		},
	}
}

// tokens reads the bearer tokens the auth section names.
func tokens(a config.Auth) ([]string, error) {
	var text string
	switch {
	case a.BearerTokensFile != "":
		b, err := os.ReadFile(a.BearerTokensFile)
		if err != nil {
			return nil, fmt.Errorf("auth.bearer_tokens_file: %w", err)
		}
		text = string(b)
	case a.BearerTokensEnv != "":
		v, ok := os.LookupEnv(a.BearerTokensEnv)
		if !ok {
			return nil, fmt.Errorf("%w: auth.bearer_tokens_env: the variable %s is not set", sluice.ErrInvalidOption, a.BearerTokensEnv)
		}
		text = v
	default:
		return nil, nil
	}
	ts, err := config.ParseTokens(text)
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	return ts, nil
}

// postgresOptions returns the PostgreSQL store's options of the config s
// (the sweeper's interval aside).
func postgresOptions(s config.Store) pgstore.Options {
	return pgstore.Options{
		Schema:           s.Postgres.Schema,
		Table:            s.Postgres.Table,
		OnLimitChange:    s.OnLimitChange,
		RequestIDTTL:     s.RequestIDTTL,
		StatementTimeout: s.Postgres.StatementTimeout,
		LockTimeout:      s.Postgres.LockTimeout,
		Batch:            s.Postgres.Batch,
		Transactions:     s.Postgres.Transactions,
	}
}

// redisOptions returns the Redis store's options of the config s.
func redisOptions(s config.Store) redisstore.Options {
	return redisstore.Options{
		Prefix:        s.Redis.Prefix,
		OnLimitChange: s.OnLimitChange,
		RequestIDTTL:  s.RequestIDTTL,
		Batch:         s.Redis.Batch,
		Pipelines:     s.Redis.Pipelines,
	}
}
