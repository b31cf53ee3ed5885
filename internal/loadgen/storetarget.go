package loadgen

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/pgstore"
	"github.com/sluicehq/sluice/redisstore"
)

// storeTarget takes from a store in this process: the store's own speed,
// without a service, a network hop to it or its failure mode.
type storeTarget struct {
	desc   string
	store  sluice.Store
	policy string
	limit  sluice.Limit
	// misconfigured says what to do about an error wrapping
	// sluice.ErrMisconfigured at the check.
	misconfigured string
	close         []func()
}

func openMemory(c TargetConfig) (Target, error) {
	st, err := memstore.New(memstore.Options{MaxKeys: max(c.MaxKeys, memstore.DefaultMaxKeys)})
	if err != nil {
		return nil, err
	}
	return newStoreTarget("memory (memstore in this process)", st, c, func() { st.Close() })
}

func newStoreTarget(desc string, st sluice.Store, c TargetConfig, closers ...func()) (*storeTarget, error) {
	t := &storeTarget{desc: desc, store: st, policy: c.Policy, limit: c.Limit, close: closers}
	if err := c.Limit.Validate(); err != nil {
		t.Close()
		return nil, err
	}
	if err := sluice.CheckLimit(st, c.Limit); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

func openRedis(ctx context.Context, c TargetConfig) (Target, error) {
	o, err := redis.ParseURL(c.URL)
	if err != nil {
		// The parser's message may quote the password.
		return nil, fmt.Errorf("%w: target %s is not a valid Redis URL (redis://[:PASSWORD@]HOST:PORT/DB, rediss://, unix:///PATH)", sluice.ErrInvalidOption, redact(c.URL))
	}
	if o.Network != "unix" {
		host, _, err := net.SplitHostPort(o.Addr)
		if err != nil {
			return nil, fmt.Errorf("%w: target %s: address %q: %v", sluice.ErrInvalidOption, redact(c.URL), o.Addr, err)
		}
		if err := checkHost(ctx, redact(c.URL), host, c.AllowRemote); err != nil {
			return nil, err
		}
		o.Dialer = checkedDial(redact(c.URL), c.AllowRemote, c.Timeout)
	}
	// As the service configures its client: every call keeps the caller's
	// deadline, and nothing is retried behind its back.
	o.ContextTimeoutEnabled, o.MaxRetries, o.DialerRetries = true, -1, 1
	o.PoolSize = max(o.PoolSize, min(c.Slots, 256))
	client := redis.NewClient(o)
	st, err := redisstore.New(client, redisstore.Options{Batch: c.StoreBatch})
	if err != nil {
		client.Close()
		return nil, err
	}
	return newStoreTarget(redact(c.URL)+" (redisstore in this process)", st, c, func() { client.Close() })
}

func openPostgres(ctx context.Context, c TargetConfig) (Target, error) {
	pc, err := pgxpool.ParseConfig(c.URL)
	if err != nil {
		// The driver's message may quote the password.
		return nil, fmt.Errorf("%w: target %s is not a valid PostgreSQL URL (postgres://USER@HOST:PORT/DB)", sluice.ErrInvalidOption, redact(c.URL))
	}
	hosts := []string{pc.ConnConfig.Host}
	for _, f := range pc.ConnConfig.Fallbacks {
		hosts = append(hosts, f.Host)
	}
	for _, h := range hosts {
		if strings.HasPrefix(h, "/") {
			continue // a Unix socket: this host
		}
		if err := checkHost(ctx, redact(c.URL), h, c.AllowRemote); err != nil {
			return nil, err
		}
	}
	dial := checkedDial(redact(c.URL), c.AllowRemote, c.Timeout)
	pc.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if network == "unix" {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}
		return dial(ctx, network, addr)
	}
	if u, err := url.Parse(c.URL); err == nil && !u.Query().Has("pool_max_conns") {
		// One connection per slot, up to 64, unless the URL says.
		pc.MaxConns = int32(min(c.Slots, 64))
	}
	o := pgstore.Options{Schema: c.PGSchema, Table: c.PGTable, Batch: c.StoreBatch}
	if err := readyPool(pc, o, c.PGPerTransactionTimeouts); err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("target %s: %w", redact(c.URL), err)
	}
	st, err := pgstore.New(ctx, pool, o)
	if err != nil {
		pool.Close()
		return nil, err
	}
	t, err := newStoreTarget(redact(c.URL)+" (pgstore in this process)", st, c, func() { st.Close() }, pool.Close)
	if err != nil {
		return nil, err
	}
	schema, table := c.PGSchema, c.PGTable
	if schema == "" {
		schema = pgstore.DefaultSchema
	}
	if table == "" {
		table = pgstore.DefaultTable
	}
	t.misconfigured = fmt.Sprintf("the schema %s (table %s) must be migrated first: run `sluice migrate -config FILE` with a config whose store.postgres names this database and schema (docs/service.md), then try again", schema, table)
	return t, nil
}

// readyPool makes pc's connections as the service makes its own: warmed
// before they serve (the load measures decisions, not PostgreSQL compiling
// its functions on a first call), and, unless perTx, with the decisions'
// timeouts in their sessions.
func readyPool(pc *pgxpool.Config, o pgstore.Options, perTx bool) error {
	var err error
	if pc.AfterConnect, err = pgstore.AfterConnect(o); err != nil {
		return err
	}
	if perTx {
		return nil
	}
	return pgstore.SessionTimeouts(pc, o)
}

func (t *storeTarget) Describe() string {
	return fmt.Sprintf("%s, policy %q, limit %q", t.desc, t.policy, t.limit)
}

func (t *storeTarget) Close() error {
	for i := len(t.close) - 1; i >= 0; i-- {
		t.close[i]()
	}
	t.close = nil
	return nil
}

func (t *storeTarget) request(key string, cost int64) sluice.Request {
	return sluice.Request{Policy: t.policy, Key: key, Cost: cost, Limit: t.limit}
}

func (t *storeTarget) Check(ctx context.Context, key string, cost int64) error {
	_, err := t.store.Peek(ctx, t.request(key, cost))
	switch {
	case err == nil:
		return nil
	case errors.Is(err, sluice.ErrMisconfigured) && t.misconfigured != "" && strings.Contains(err.Error(), "run Migrate"):
		// (Not for the store's other misconfigurations, such as a
		// session without its timeouts, whose errors say what to do.)
		return fmt.Errorf("%s: %s: %w", t.desc, t.misconfigured, err)
	case errors.Is(err, sluice.ErrInvalidCost):
		return fmt.Errorf("cost %d: %w", cost, err)
	}
	return fmt.Errorf("%s: %w", t.desc, err)
}

func (t *storeTarget) Sender(int) Sender { return t }

// Send takes from the store; its latency ends when the take returns.
func (t *storeTarget) Send(ctx context.Context, items []Item, out []Result) time.Time {
	t.send(ctx, items, out)
	return time.Time{}
}

func (t *storeTarget) send(ctx context.Context, items []Item, out []Result) {
	d, err := t.store.Take(ctx, t.request(items[0].Key, items[0].Cost))
	switch {
	case err != nil:
		out[0] = fail(storeErrorKind(err), err.Error())
	case d.Allowed:
		out[0] = Result{Outcome: Allowed}
	default:
		out[0] = Result{Outcome: Denied}
	}
}

func storeErrorKind(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return kindTimeout
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, sluice.ErrTooManyKeys):
		return "too many keys"
	case sluice.IsUnavailable(err):
		return "store unavailable"
	case errors.Is(err, sluice.ErrMisconfigured):
		return "store misconfigured"
	case sluice.IsInvalid(err):
		return "invalid request"
	}
	return "store error"
}
